//! A message body's preview for the console and the HTTP API: JSON and XML pretty-printed, text as is, hex for binary; bounded, with the formatter named.

use crate::http_api::{HEX_PREVIEW_BYTES, PREVIEW_BYTES};

/// The most text a pretty-printed preview may hold: indentation grows with the depth, so 64 KiB
/// of nested XML would print as ~167 MB; past this the body is shown as text, as it is.
pub(crate) const MAX_PRETTY_BYTES: usize = 256 << 10;

/// A body shown to a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Preview {
    /// `json`, `xml`, `text`, `hex` or `empty`.
    pub formatter: &'static str,
    pub text: String,
    /// Only the first bytes of the body are shown.
    pub truncated: bool,
}

pub(crate) fn preview(body: &[u8]) -> Preview {
    if body.is_empty() {
        return Preview {
            formatter: "empty",
            text: String::new(),
            truncated: false,
        };
    }
    let head = &body[..body.len().min(PREVIEW_BYTES)];
    let truncated = head.len() < body.len();
    // A cut may split a UTF-8 sequence: up to 3 bytes at the end may be dropped.
    let text = match std::str::from_utf8(head) {
        Ok(t) => Some(t),
        Err(e) if truncated && e.valid_up_to() + 4 > head.len() && e.error_len().is_none() => {
            std::str::from_utf8(&head[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    let Some(text) = text.filter(|t| is_text(t)) else {
        return hex(body);
    };
    if !truncated {
        let t = text.trim_start();
        if t.starts_with('{') || t.starts_with('[') {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
                if let Ok(pretty) = serde_json::to_string_pretty(&v)
                    .map_err(drop)
                    .and_then(|p| {
                        if p.len() <= MAX_PRETTY_BYTES {
                            Ok(p)
                        } else {
                            Err(())
                        }
                    })
                {
                    return Preview {
                        formatter: "json",
                        text: pretty,
                        truncated,
                    };
                }
            }
        }
        if t.starts_with('<') {
            if let Some(pretty) = pretty_xml(text) {
                return Preview {
                    formatter: "xml",
                    text: pretty,
                    truncated,
                };
            }
        }
    }
    Preview {
        formatter: "text",
        text: text.to_string(),
        truncated,
    }
}

/// Printable text: no control characters but tab, line feed and carriage return.
fn is_text(t: &str) -> bool {
    t.chars()
        .all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t'))
}

/// XML indented two spaces an element, or `None` if it is not well-formed.
fn pretty_xml(text: &str) -> Option<String> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(text);
    reader.config_mut().trim_text(true);
    let mut writer = quick_xml::Writer::new_with_indent(Vec::new(), b' ', 2);
    let mut depth = 0i64;
    let mut elements = 0;
    loop {
        match reader.read_event().ok()? {
            Event::Eof => break,
            e => {
                match &e {
                    Event::Start(_) => {
                        depth += 1;
                        elements += 1;
                    }
                    Event::End(_) => depth -= 1,
                    Event::Empty(_) => elements += 1,
                    _ => {}
                }
                writer.write_event(e).ok()?;
                if writer.get_ref().len() > MAX_PRETTY_BYTES {
                    return None;
                }
            }
        }
    }
    if depth != 0 || elements == 0 {
        return None;
    }
    String::from_utf8(writer.into_inner()).ok()
}

/// A hex dump (offset, 16 bytes, their printable characters) of the first bytes.
fn hex(body: &[u8]) -> Preview {
    use std::fmt::Write;
    let head = &body[..body.len().min(HEX_PREVIEW_BYTES)];
    let mut out = String::with_capacity(head.len() * 4 + 16);
    for (i, chunk) in head.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", i * 16);
        for j in 0..16 {
            match chunk.get(j) {
                Some(b) => {
                    let _ = write!(out, "{b:02x} ");
                }
                None => out.push_str("   "),
            }
            if j == 7 {
                out.push(' ');
            }
        }
        out.push(' ');
        for &b in chunk {
            out.push(if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            });
        }
        out.push('\n');
    }
    Preview {
        formatter: "hex",
        text: out,
        truncated: head.len() < body.len(),
    }
}

#[cfg(test)]
mod tests {
    /// Deep nesting pretty-prints into far more than it holds: past the cap it is shown as the
    /// text it is (a 28 KB body of 4,000 nested elements printed as 32 MB).
    #[test]
    fn deep_nesting_is_shown_as_text_not_blown_up() {
        let xml = format!("{}{}", "<a>".repeat(4000), "</a>".repeat(4000));
        let p = super::preview(xml.as_bytes());
        assert_eq!((p.formatter, p.text.len()), ("text", xml.len()));
        let nested = format!("{}{}", "[".repeat(119), "]".repeat(119));
        let json = format!("[{}]", vec![nested; 200].join(","));
        let p = super::preview(json.as_bytes());
        assert_eq!((p.formatter, p.text.len()), ("text", json.len()));
        // Shallow documents are still pretty-printed.
        assert_eq!(super::preview(b"<a><b/></a>").formatter, "xml");
        assert_eq!(super::preview(br#"{"a": [1, 2]}"#).formatter, "json");
    }

    use super::*;

    #[test]
    fn json_is_pretty_printed() {
        let p = preview(br#"{"a":1,"b":[true,null]}"#);
        assert_eq!(p.formatter, "json");
        assert!(p.text.contains("\n  \"a\": 1"), "{}", p.text);
    }

    #[test]
    fn xml_is_indented() {
        let p = preview(b"<order><id>7</id><items><item/></items></order>");
        assert_eq!(p.formatter, "xml");
        assert!(p.text.contains("\n  <id>7</id>"), "{}", p.text);
    }

    #[test]
    fn broken_json_and_xml_are_text() {
        assert_eq!(preview(b"{not json").formatter, "text");
        assert_eq!(preview(b"<a><b></a>").formatter, "text");
        assert_eq!(preview(b"hello").formatter, "text");
    }

    #[test]
    fn binary_is_hex_and_bounded() {
        let p = preview(&[0u8, 1, 2, 0xff]);
        assert_eq!(p.formatter, "hex");
        assert!(p.text.starts_with("00000000  00 01 02 ff"), "{}", p.text);
        let big = vec![0u8; HEX_PREVIEW_BYTES * 3];
        let p = preview(&big);
        assert!(p.truncated);
        assert_eq!(p.text.lines().count(), HEX_PREVIEW_BYTES / 16);
    }

    #[test]
    fn long_text_is_cut_at_the_limit() {
        let mut body = "é".repeat(PREVIEW_BYTES);
        body.push('x');
        let p = preview(body.as_bytes());
        assert_eq!(p.formatter, "text");
        assert!(p.truncated);
        assert!(p.text.len() <= PREVIEW_BYTES);
        assert_eq!(preview(b"").formatter, "empty");
    }
}
