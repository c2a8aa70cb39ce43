//! Generates the `mq.v1` gRPC code with the protoc binary vendored by `protoc-bin-vendored`,
//! so a fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single-threaded; prost-build reads PROTOC.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/mq/v1/mq.proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .bytes(".")
        // prost's codec with an encoder that reserves each message's length first (codec.rs).
        .codec_path("crate::codec::MqCodec")
        // For gRPC server reflection (`grpcurl list` / `describe`).
        .file_descriptor_set_path(out.join("mq_descriptor.bin"))
        .compile_protos(&["proto/mq/v1/mq.proto"], &["proto"])?;
    Ok(())
}
