//! Generates the `mq.v1` gRPC code with the protoc binary vendored by `protoc-bin-vendored`,
//! so a fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single-threaded; prost-build reads PROTOC.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/mq/v1/mq.proto");
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&["proto/mq/v1/mq.proto"], &["proto"])?;
    Ok(())
}
