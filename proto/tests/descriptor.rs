//! The wire contract does not break: every message, field, enum value and RPC of the committed
//! descriptor `proto/mq.v1.binpb` is still there with the same number, name, type and label.
//!
//! An intentional additive change (a new field, message, enum value or RPC) passes as is; to
//! record it, regenerate the committed descriptor with
//! `MQ_WRITE_DESCRIPTOR=1 cargo test -p mq-proto --test descriptor` and commit
//! `proto/mq.v1.binpb`. A failure here means a client built from an earlier proto would
//! misread the wire: undo the change (add a new field instead; `reserved` what you remove).

use std::collections::HashMap;

use prost::Message as _;
use prost_types::{
    field_descriptor_proto::Label, DescriptorProto, EnumDescriptorProto, FileDescriptorSet,
};

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mq.v1.binpb");

fn current() -> FileDescriptorSet {
    let mut set = FileDescriptorSet::decode(mq_proto::FILE_DESCRIPTOR_SET).expect("built set");
    // Comments are not part of the contract.
    for f in &mut set.file {
        f.source_code_info = None;
    }
    set
}

fn committed() -> FileDescriptorSet {
    let bytes = std::fs::read(COMMITTED).unwrap_or_else(|e| {
        panic!("cannot read {COMMITTED}: {e}; write it with MQ_WRITE_DESCRIPTOR=1 (see the top of this file)")
    });
    FileDescriptorSet::decode(&bytes[..]).expect("the committed descriptor decodes")
}

/// Every message and enum of `set`'s `mq.v1` files by full name (`.mq.v1.Message.Nested`).
fn index(
    set: &FileDescriptorSet,
) -> (
    HashMap<String, &DescriptorProto>,
    HashMap<String, &EnumDescriptorProto>,
) {
    fn walk<'a>(
        prefix: &str,
        m: &'a DescriptorProto,
        msgs: &mut HashMap<String, &'a DescriptorProto>,
        enums: &mut HashMap<String, &'a EnumDescriptorProto>,
    ) {
        let name = format!("{prefix}.{}", m.name());
        for e in &m.enum_type {
            enums.insert(format!("{name}.{}", e.name()), e);
        }
        for n in &m.nested_type {
            walk(&name, n, msgs, enums);
        }
        msgs.insert(name, m);
    }
    let (mut msgs, mut enums) = (HashMap::new(), HashMap::new());
    for f in set.file.iter().filter(|f| f.package() == "mq.v1") {
        let prefix = format!(".{}", f.package());
        for m in &f.message_type {
            walk(&prefix, m, &mut msgs, &mut enums);
        }
        for e in &f.enum_type {
            enums.insert(format!("{prefix}.{}", e.name()), e);
        }
    }
    (msgs, enums)
}

/// What `new` breaks of `old`: one line per problem.
fn breaking_changes(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<String> {
    let mut out = Vec::new();
    let (old_msgs, old_enums) = index(old);
    let (new_msgs, new_enums) = index(new);
    for (name, om) in &old_msgs {
        let Some(nm) = new_msgs.get(name) else {
            out.push(format!("message {name} was removed or renamed"));
            continue;
        };
        let reserved = |n: i32| {
            nm.reserved_range
                .iter()
                .any(|r| r.start() <= n && n < r.end())
        };
        for of in &om.field {
            let n = of.number();
            let Some(nf) = nm.field.iter().find(|f| f.number() == n) else {
                if !reserved(n) {
                    out.push(format!(
                        "{name}.{} (field {n}) was removed without `reserved {n};`",
                        of.name()
                    ));
                }
                continue;
            };
            let what = format!("{name}.{} (field {n})", of.name());
            if nf.name() != of.name() {
                out.push(format!(
                    "{what} was renamed to {} (JSON and text formats use names)",
                    nf.name()
                ));
            }
            if nf.r#type() != of.r#type() || nf.type_name() != of.type_name() {
                out.push(format!(
                    "{what} changed type from {:?} {} to {:?} {}",
                    of.r#type(),
                    of.type_name(),
                    nf.r#type(),
                    nf.type_name()
                ));
            }
            if (nf.label() == Label::Repeated) != (of.label() == Label::Repeated) {
                out.push(format!("{what} changed between repeated and single"));
            }
            if nf.proto3_optional() != of.proto3_optional() {
                out.push(format!("{what} changed presence (`optional`)"));
            }
            if nf.oneof_index.is_some() != of.oneof_index.is_some() {
                out.push(format!("{what} moved into or out of a oneof"));
            }
        }
        // A new field must not take a number the old message had reserved.
        for nf in &nm.field {
            let n = nf.number();
            if om
                .reserved_range
                .iter()
                .any(|r| r.start() <= n && n < r.end())
            {
                out.push(format!("{name}.{} reuses reserved number {n}", nf.name()));
            }
        }
    }
    for (name, oe) in &old_enums {
        let Some(ne) = new_enums.get(name) else {
            out.push(format!("enum {name} was removed or renamed"));
            continue;
        };
        for ov in &oe.value {
            match ne.value.iter().find(|v| v.number() == ov.number()) {
                None => out.push(format!(
                    "enum value {name}.{} ({}) was removed",
                    ov.name(),
                    ov.number()
                )),
                Some(nv) if nv.name() != ov.name() => out.push(format!(
                    "enum value {name} {} was renamed from {} to {}",
                    ov.number(),
                    ov.name(),
                    nv.name()
                )),
                Some(_) => {}
            }
        }
    }
    let services =
        |set: &FileDescriptorSet| -> HashMap<String, Vec<prost_types::MethodDescriptorProto>> {
            set.file
                .iter()
                .filter(|f| f.package() == "mq.v1")
                .flat_map(|f| f.service.iter())
                .map(|s| (s.name().to_string(), s.method.clone()))
                .collect()
        };
    let new_services = services(new);
    for (service, methods) in services(old) {
        let Some(now) = new_services.get(&service) else {
            out.push(format!("service mq.v1.{service} was removed or renamed"));
            continue;
        };
        for om in methods {
            let path = format!("/mq.v1.{service}/{}", om.name());
            match now.iter().find(|m| m.name() == om.name()) {
                None => out.push(format!("rpc {path} was removed or renamed")),
                Some(nm) => {
                    if nm.input_type() != om.input_type()
                        || nm.output_type() != om.output_type()
                        || nm.client_streaming() != om.client_streaming()
                        || nm.server_streaming() != om.server_streaming()
                    {
                        out.push(format!(
                            "rpc {path} changed its request, response or streaming"
                        ));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_wire_contract_only_grows() {
    if std::env::var_os("MQ_WRITE_DESCRIPTOR").is_some() {
        std::fs::write(COMMITTED, current().encode_to_vec()).expect("write the descriptor");
        eprintln!("wrote {COMMITTED}");
    }
    let broken = breaking_changes(&committed(), &current());
    assert!(
        broken.is_empty(),
        "the proto breaks the committed mq.v1 contract ({COMMITTED}):\n  {}\n\
         mq.v1 changes only additively: add a new field or RPC instead, and `reserved` what you \
         remove (README, Versioning; and the top of proto/tests/descriptor.rs)",
        broken.join("\n  ")
    );
}

/// The check itself catches what it must: a renumbered, retyped, renamed or removed field, a
/// renamed enum value, a changed RPC; and lets an added field through.
#[test]
fn the_check_catches_breaking_changes() {
    let base = current();
    let edit = |f: &dyn Fn(&mut FileDescriptorSet)| {
        let mut s = base.clone();
        f(&mut s);
        breaking_changes(&base, &s)
    };
    let with_msg = |name: &'static str, f: fn(&mut DescriptorProto)| {
        move |s: &mut FileDescriptorSet| {
            let m = s
                .file
                .iter_mut()
                .flat_map(|f| f.message_type.iter_mut())
                .find(|m| m.name() == name)
                .expect(name);
            f(m)
        }
    };
    let renumbered = edit(&with_msg("SendRequest", |m| {
        m.field
            .iter_mut()
            .find(|f| f.name() == "first_seq")
            .unwrap()
            .number = Some(99)
    }));
    assert!(
        renumbered
            .iter()
            .any(|l| l.contains("SendRequest.first_seq (field 1) was removed")),
        "{renumbered:?}"
    );
    let retyped = edit(&with_msg("SendResponse", |m| {
        let f = m.field.iter_mut().find(|f| f.name() == "count").unwrap();
        f.set_type(prost_types::field_descriptor_proto::Type::Uint64);
    }));
    assert!(
        retyped.iter().any(|l| l.contains("changed type")),
        "{retyped:?}"
    );
    let renamed = edit(&with_msg("Message", |m| {
        m.field
            .iter_mut()
            .find(|f| f.name() == "label")
            .unwrap()
            .name = Some("title".into())
    }));
    assert!(
        renamed.iter().any(|l| l.contains("renamed to title")),
        "{renamed:?}"
    );
    let single = edit(&with_msg("SendResponse", |m| {
        let f = m.field.iter_mut().find(|f| f.name() == "ids").unwrap();
        f.set_label(Label::Optional);
    }));
    assert!(single.iter().any(|l| l.contains("repeated")), "{single:?}");
    let enum_renamed = edit(&|s: &mut FileDescriptorSet| {
        let e = s
            .file
            .iter_mut()
            .flat_map(|f| f.enum_type.iter_mut())
            .find(|e| e.name() == "Delivery")
            .unwrap();
        e.value[1].name = Some("DELIVERY_FAST".into());
    });
    assert!(
        enum_renamed.iter().any(|l| l.contains("DELIVERY_FAST")),
        "{enum_renamed:?}"
    );
    let rpc_changed = edit(&|s: &mut FileDescriptorSet| {
        let m = s
            .file
            .iter_mut()
            .flat_map(|f| f.service.iter_mut())
            .flat_map(|s| s.method.iter_mut())
            .find(|m| m.name() == "Send")
            .unwrap();
        m.client_streaming = Some(false);
    });
    assert!(
        rpc_changed
            .iter()
            .any(|l| l.contains("/mq.v1.MessageQueueService/Send")),
        "{rpc_changed:?}"
    );
    let added = edit(&with_msg("SendRequest", |m| {
        let mut f = m.field[0].clone();
        f.name = Some("a_new_field".into());
        f.json_name = Some("aNewField".into());
        f.number = Some(1000);
        m.field.push(f);
    }));
    assert!(added.is_empty(), "an added field is not a break: {added:?}");
}
