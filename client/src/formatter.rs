//! Message-body formatters: turn a typed body into bytes plus a [`BodyType`] tag, and back.
//!
//! The tag travels with the message (the broker stores it as an integer, like MSMQ's
//! `BodyType`) so that a receiver can pick the matching formatter.
//!
//! | formatter            | tag                  | encoding                                              |
//! |----------------------|----------------------|-------------------------------------------------------|
//! | [`RawFormatter`]     | [`BodyType::Raw`]    | the bytes themselves ("body stream"); `String` as UTF-8 |
//! | [`BinaryFormatter`]  | [`BodyType::Binary`] | serde + postcard (compact, varint integers)           |
//! | [`XmlFormatter`]     | [`BodyType::Xml`]    | serde + quick-xml, root element named after the type  |
//! | [`JsonFormatter`]    | [`BodyType::Json`]   | serde + serde_json                                    |
//! | [`ManualFormatter`]  | [`BodyType::Manual`] | hand-written [`ManualEncode`] (the white paper's `BinaryWriter`) |
//!
//! The binary and manual decoders reject trailing bytes after the value and JSON rejects
//! anything but whitespace after it. XML checks the root element's name; quick-xml ignores
//! content after the root element.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Tag carried with each message (the broker stores it as an integer "body type", like
/// MSMQ's `BodyType`) so a receiver picks the right formatter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BodyType {
    /// Bytes as they are (MSMQ's `BodyStream`).
    Raw = 0,
    /// serde + postcard.
    Binary = 1,
    /// serde + quick-xml.
    Xml = 2,
    /// serde + serde_json.
    Json = 3,
    /// Hand-written [`ManualEncode`] encoding.
    Manual = 4,
}

impl BodyType {
    /// All body types, in tag order.
    pub const ALL: [BodyType; 5] = [
        BodyType::Raw,
        BodyType::Binary,
        BodyType::Xml,
        BodyType::Json,
        BodyType::Manual,
    ];

    /// The tag as stored by the broker.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// The body type for a stored tag, `None` for an unknown tag.
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(BodyType::Raw),
            1 => Some(BodyType::Binary),
            2 => Some(BodyType::Xml),
            3 => Some(BodyType::Json),
            4 => Some(BodyType::Manual),
            _ => None,
        }
    }

    /// Lower-case name, as accepted by [`FromStr`]: `raw`, `binary`, `xml`, `json`, `manual`.
    pub fn name(&self) -> &'static str {
        match self {
            BodyType::Raw => "raw",
            BodyType::Binary => "binary",
            BodyType::Xml => "xml",
            BodyType::Json => "json",
            BodyType::Manual => "manual",
        }
    }
}

impl fmt::Display for BodyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<u32> for BodyType {
    type Error = FormatError;
    fn try_from(v: u32) -> Result<Self, FormatError> {
        BodyType::from_u32(v).ok_or(FormatError::UnknownBodyType(v))
    }
}

impl From<BodyType> for u32 {
    fn from(b: BodyType) -> u32 {
        b as u32
    }
}

/// Error of [`BodyType::from_str`]: names what was given and lists the choices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown body type `{given}` (choose one of: raw, binary, xml, json, manual)")]
pub struct ParseBodyTypeError {
    /// The rejected input.
    pub given: String,
}

impl FromStr for BodyType {
    type Err = ParseBodyTypeError;
    /// Case-insensitive, surrounding whitespace ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        BodyType::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(t))
            .ok_or_else(|| ParseBodyTypeError {
                given: s.to_string(),
            })
    }
}

/// What can go wrong while encoding or decoding a body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    /// The value could not be encoded (e.g. a string XML 1.0 cannot carry).
    #[error("{formatter} formatter cannot encode the body: {reason}")]
    Encode {
        formatter: &'static str,
        reason: String,
    },
    /// The bytes are not a valid encoding of the expected type (truncated, trailing bytes,
    /// malformed, wrong root element, invalid UTF-8, ...).
    #[error("{formatter} formatter cannot decode the body: {reason}")]
    Decode {
        formatter: &'static str,
        reason: String,
    },
    /// The message carries a different body type than the formatter handles.
    #[error("wrong body type: expected {expected}, the message carries {found}")]
    WrongBodyType { expected: BodyType, found: BodyType },
    /// The message carries a body-type tag this version does not know.
    #[error("unknown body type tag {0} (known: 0=raw, 1=binary, 2=xml, 3=json, 4=manual)")]
    UnknownBodyType(u32),
    /// This formatter cannot carry this kind of value at all (not an error in the data).
    #[error("{formatter} formatter does not support {what}: {reason}")]
    Unsupported {
        formatter: &'static str,
        what: String,
        reason: String,
    },
}

impl FormatError {
    fn encode(formatter: &'static str, reason: impl fmt::Display) -> Self {
        FormatError::Encode {
            formatter,
            reason: reason.to_string(),
        }
    }

    fn decode(formatter: &'static str, reason: impl fmt::Display) -> Self {
        FormatError::Decode {
            formatter,
            reason: reason.to_string(),
        }
    }

    /// `true` for [`FormatError::Unsupported`] (a combination to skip, not a failure).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, FormatError::Unsupported { .. })
    }
}

/// A formatter turns a typed body into bytes and back.
pub trait Formatter<T>: Send + Sync {
    /// The tag to send with bodies this formatter encodes.
    fn body_type(&self) -> BodyType;
    /// Encodes `value` into a message body.
    fn encode(&self, value: &T) -> Result<Bytes, FormatError>;
    /// Decodes a message body; rejects bodies that are not exactly one encoded value.
    fn decode(&self, body: &[u8]) -> Result<T, FormatError>;

    /// Like [`Formatter::decode`], but first checks the body type the message carries.
    fn decode_tagged(&self, body: &[u8], found: BodyType) -> Result<T, FormatError> {
        let expected = self.body_type();
        if expected != found {
            return Err(FormatError::WrongBodyType { expected, found });
        }
        self.decode(body)
    }
}

// ---------------------------------------------------------------------------------------------
// Binary (postcard)

/// serde + postcard: compact, varint integers, length-prefixed strings. For any
/// `T: Serialize + DeserializeOwned`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BinaryFormatter;

impl<T: Serialize + DeserializeOwned> Formatter<T> for BinaryFormatter {
    fn body_type(&self) -> BodyType {
        BodyType::Binary
    }

    fn encode(&self, value: &T) -> Result<Bytes, FormatError> {
        postcard::to_allocvec(value)
            .map(Bytes::from)
            .map_err(|e| FormatError::encode("binary", e))
    }

    fn decode(&self, body: &[u8]) -> Result<T, FormatError> {
        let (value, rest) =
            postcard::take_from_bytes::<T>(body).map_err(|e| FormatError::decode("binary", e))?;
        if !rest.is_empty() {
            return Err(FormatError::decode(
                "binary",
                format_args!("{} trailing byte(s) after the value", rest.len()),
            ));
        }
        Ok(value)
    }
}

// ---------------------------------------------------------------------------------------------
// XML (quick-xml)

/// serde + quick-xml. The root element is named after the type (`<Order>`, `<String>`,
/// `<i32>`; `()` becomes `<unit/>`), no XML declaration. Text is escaped by quick-xml
/// (`<`, `>`, `&`; `\r` as `&#13;` so it survives XML end-of-line normalization); leading and
/// trailing whitespace and empty strings round-trip.
///
/// XML 1.0 cannot carry the control characters U+0000–U+0008, U+000B, U+000C,
/// U+000E–U+001F, nor U+FFFE/U+FFFF (tab, line feed and carriage return are fine). Encoding
/// a value containing one of them fails with [`FormatError::Encode`] instead of producing a
/// document that is not well-formed; decoding such a document fails with
/// [`FormatError::Decode`]. Use the binary, JSON, raw or manual formatter for such text.
///
/// Meant for structs, strings and scalars; a top-level sequence has no single root element.
#[derive(Debug, Clone, Copy, Default)]
pub struct XmlFormatter;

/// The root element name for `T`: the last path segment of its type name without generics.
fn xml_root_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    if full == "()" {
        return "unit";
    }
    let base = full.split('<').next().unwrap_or(full);
    let name = base.rsplit("::").next().unwrap_or(base);
    let mut chars = name.chars();
    let valid = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if valid {
        name
    } else {
        "value"
    }
}

/// Finds the first character XML 1.0 cannot carry: returns its byte offset and the char.
fn find_non_xml_char(s: &str) -> Option<(usize, char)> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c < 0x20 {
            if !matches!(c, b'\t' | b'\n' | b'\r') {
                return Some((i, char::from(c)));
            }
        } else if c == 0xEF && i + 2 < b.len() && b[i + 1] == 0xBF && (b[i + 2] & 0xFE) == 0xBE {
            // U+FFFE / U+FFFF (EF BF BE / EF BF BF); surrogates cannot occur in a &str.
            return s[i..].chars().next().map(|ch| (i, ch));
        }
        i += 1;
    }
    None
}

/// Checks the root element's name and returns the document from the root element on (the
/// prolog — declaration, comments, whitespace — cut off: quick-xml would otherwise read
/// whitespace before the root of a scalar as its text).
fn root_element<'a>(xml: &'a str, expected: &str) -> Result<&'a str, FormatError> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    loop {
        let start = usize::try_from(reader.buffer_position()).unwrap_or(0);
        match reader.read_event() {
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) => {
                let local = e.local_name();
                let name: &str = local.as_ref();
                if name != expected {
                    return Err(FormatError::decode(
                        "xml",
                        format_args!("root element is <{name}>, expected <{expected}>"),
                    ));
                }
                return Ok(match xml.get(start..) {
                    Some(rest) if rest.starts_with('<') => rest,
                    _ => xml,
                });
            }
            Ok(Event::Eof) => return Err(FormatError::decode("xml", "no root element")),
            Ok(_) => {}
            Err(e) => return Err(FormatError::decode("xml", e)),
        }
    }
}

impl<T: Serialize + DeserializeOwned> Formatter<T> for XmlFormatter {
    fn body_type(&self) -> BodyType {
        BodyType::Xml
    }

    fn encode(&self, value: &T) -> Result<Bytes, FormatError> {
        let mut out = String::new();
        quick_xml::se::to_writer_with_root(&mut out, xml_root_name::<T>(), value)
            .map_err(|e| FormatError::encode("xml", e))?;
        if let Some((at, ch)) = find_non_xml_char(&out) {
            return Err(FormatError::encode(
                "xml",
                format_args!(
                    "XML 1.0 cannot carry the character U+{:04X} (at byte {at} of the document); \
                     use the binary, json, raw or manual formatter",
                    u32::from(ch)
                ),
            ));
        }
        Ok(Bytes::from(out.into_bytes()))
    }

    fn decode(&self, body: &[u8]) -> Result<T, FormatError> {
        let text = std::str::from_utf8(body)
            .map_err(|e| FormatError::decode("xml", format_args!("not UTF-8: {e}")))?;
        if let Some((at, ch)) = find_non_xml_char(text) {
            return Err(FormatError::decode(
                "xml",
                format_args!(
                    "not well-formed XML 1.0: character U+{:04X} at byte {at}",
                    u32::from(ch)
                ),
            ));
        }
        let root = root_element(text, xml_root_name::<T>())?;
        quick_xml::de::from_str(root).map_err(|e| FormatError::decode("xml", e))
    }
}

// ---------------------------------------------------------------------------------------------
// JSON (serde_json)

/// serde + serde_json, compact (no whitespace). Build serde_json with the `float_roundtrip`
/// feature so `f64` values decode bit-exactly.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonFormatter;

impl<T: Serialize + DeserializeOwned> Formatter<T> for JsonFormatter {
    fn body_type(&self) -> BodyType {
        BodyType::Json
    }

    fn encode(&self, value: &T) -> Result<Bytes, FormatError> {
        serde_json::to_vec(value)
            .map(Bytes::from)
            .map_err(|e| FormatError::encode("json", e))
    }

    fn decode(&self, body: &[u8]) -> Result<T, FormatError> {
        // from_slice rejects anything but whitespace after the value.
        serde_json::from_slice(body).map_err(|e| FormatError::decode("json", e))
    }
}

// ---------------------------------------------------------------------------------------------
// Raw

/// Bytes as they are ("body stream"): for [`Bytes`], `Vec<u8>` and `String` (UTF-8 bytes, no
/// length prefix; decoding checks UTF-8).
#[derive(Debug, Clone, Copy, Default)]
pub struct RawFormatter;

impl Formatter<Bytes> for RawFormatter {
    fn body_type(&self) -> BodyType {
        BodyType::Raw
    }
    fn encode(&self, value: &Bytes) -> Result<Bytes, FormatError> {
        Ok(value.clone())
    }
    fn decode(&self, body: &[u8]) -> Result<Bytes, FormatError> {
        Ok(Bytes::copy_from_slice(body))
    }
}

impl Formatter<Vec<u8>> for RawFormatter {
    fn body_type(&self) -> BodyType {
        BodyType::Raw
    }
    fn encode(&self, value: &Vec<u8>) -> Result<Bytes, FormatError> {
        Ok(Bytes::copy_from_slice(value))
    }
    fn decode(&self, body: &[u8]) -> Result<Vec<u8>, FormatError> {
        Ok(body.to_vec())
    }
}

impl Formatter<String> for RawFormatter {
    fn body_type(&self) -> BodyType {
        BodyType::Raw
    }
    fn encode(&self, value: &String) -> Result<Bytes, FormatError> {
        Ok(Bytes::copy_from_slice(value.as_bytes()))
    }
    fn decode(&self, body: &[u8]) -> Result<String, FormatError> {
        std::str::from_utf8(body)
            .map(str::to_owned)
            .map_err(|e| FormatError::decode("raw", format_args!("body is not UTF-8: {e}")))
    }
}

// ---------------------------------------------------------------------------------------------
// Manual (BinaryWriter-style)

/// Hand-written binary encoding, the white paper's manual `BinaryWriter` optimization.
///
/// Conventions: fixed-width little-endian integers and floats, strings as a `u32` byte length
/// followed by UTF-8, arrays as a `u32` element count followed by the elements, fields in
/// declaration order, no tags. Lengths above `u32::MAX` cannot be encoded (encoding panics);
/// message bodies are far smaller.
pub trait ManualEncode: Sized {
    /// Appends the encoding of `self` to `out`.
    fn encode_manual(&self, out: &mut Vec<u8>);
    /// Reads one value from the front of `input` and advances it past the value. Fails with
    /// [`FormatError::Decode`] if `input` ends early or holds invalid data.
    fn decode_manual(input: &mut &[u8]) -> Result<Self, FormatError>;
    /// The exact (or a close) encoded size, so the encoder can reserve the buffer once.
    fn manual_size_hint(&self) -> usize {
        0
    }
}

/// Takes `n` bytes off the front of `input`, or fails naming what was being read.
pub fn take_bytes<'a>(input: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], FormatError> {
    if input.len() < n {
        return Err(FormatError::decode(
            "manual",
            format_args!(
                "truncated input: {what} needs {n} byte(s), only {} left",
                input.len()
            ),
        ));
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

fn take_array<const N: usize>(input: &mut &[u8], what: &str) -> Result<[u8; N], FormatError> {
    let b = take_bytes(input, N, what)?;
    let mut a = [0u8; N];
    a.copy_from_slice(b);
    Ok(a)
}

/// Writes a `u32` length/count prefix.
fn put_len(out: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).expect("manual encoding: length above u32::MAX");
    out.extend_from_slice(&len.to_le_bytes());
}

macro_rules! manual_fixed {
    ($($t:ty),*) => {$(
        impl ManualEncode for $t {
            #[inline]
            fn encode_manual(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn decode_manual(input: &mut &[u8]) -> Result<Self, FormatError> {
                Ok(<$t>::from_le_bytes(take_array(input, stringify!($t))?))
            }
            fn manual_size_hint(&self) -> usize {
                std::mem::size_of::<$t>()
            }
        }
    )*};
}
manual_fixed!(i32, i64, u32, u64, f64);

/// Zero bytes (the empty body).
impl ManualEncode for () {
    fn encode_manual(&self, _out: &mut Vec<u8>) {}
    fn decode_manual(_input: &mut &[u8]) -> Result<Self, FormatError> {
        Ok(())
    }
}

/// `u32` byte length, then UTF-8.
impl ManualEncode for String {
    #[inline]
    fn encode_manual(&self, out: &mut Vec<u8>) {
        put_len(out, self.len());
        out.extend_from_slice(self.as_bytes());
    }
    fn decode_manual(input: &mut &[u8]) -> Result<Self, FormatError> {
        let len = u32::from_le_bytes(take_array(input, "string length")?) as usize;
        let bytes = take_bytes(input, len, "string content")?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|e| FormatError::decode("manual", format_args!("string is not UTF-8: {e}")))
    }
    fn manual_size_hint(&self) -> usize {
        4 + self.len()
    }
}

/// `u32` element count, then the elements.
impl<T: ManualEncode> ManualEncode for Vec<T> {
    fn encode_manual(&self, out: &mut Vec<u8>) {
        put_len(out, self.len());
        for item in self {
            item.encode_manual(out);
        }
    }
    fn decode_manual(input: &mut &[u8]) -> Result<Self, FormatError> {
        let count = u32::from_le_bytes(take_array(input, "array count")?) as usize;
        // Never trust the count for the allocation: every element takes at least one byte
        // (except zero-sized ones), so the remaining input bounds the useful capacity.
        let mut v = Vec::with_capacity(count.min(input.len()));
        for _ in 0..count {
            v.push(T::decode_manual(input)?);
        }
        Ok(v)
    }
    fn manual_size_hint(&self) -> usize {
        4 + self
            .iter()
            .map(ManualEncode::manual_size_hint)
            .sum::<usize>()
    }
}

/// [`Formatter`] for any `T: ManualEncode`; decoding requires the body to hold exactly one
/// value (truncated input and trailing bytes are errors).
#[derive(Debug, Clone, Copy, Default)]
pub struct ManualFormatter;

impl<T: ManualEncode> Formatter<T> for ManualFormatter {
    fn body_type(&self) -> BodyType {
        BodyType::Manual
    }

    fn encode(&self, value: &T) -> Result<Bytes, FormatError> {
        let mut out = Vec::with_capacity(value.manual_size_hint());
        value.encode_manual(&mut out);
        Ok(Bytes::from(out))
    }

    fn decode(&self, body: &[u8]) -> Result<T, FormatError> {
        let mut input = body;
        let value = T::decode_manual(&mut input)?;
        if !input.is_empty() {
            return Err(FormatError::decode(
                "manual",
                format_args!(
                    "{} trailing byte(s) after the value ({} byte(s) used)",
                    input.len(),
                    body.len() - input.len()
                ),
            ));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Note {
        title: String,
        body: String,
        #[serde(default)]
        tags: Vec<String>,
        n: i64,
    }

    fn is_xml_char(c: char) -> bool {
        matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
    }

    #[test]
    fn body_type_tags_names_and_parsing() {
        for b in BodyType::ALL {
            assert_eq!(BodyType::from_u32(b.as_u32()), Some(b));
            assert_eq!(b.name().parse::<BodyType>().unwrap(), b);
            assert_eq!(BodyType::try_from(u32::from(b)).unwrap(), b);
        }
        assert_eq!(BodyType::from_u32(5), None);
        assert!(matches!(
            BodyType::try_from(77),
            Err(FormatError::UnknownBodyType(77))
        ));
        assert_eq!(" XML ".parse::<BodyType>().unwrap(), BodyType::Xml);
        let err = "soap".parse::<BodyType>().unwrap_err().to_string();
        assert!(err.contains("`soap`"), "{err}");
        assert!(err.contains("raw, binary, xml, json, manual"), "{err}");
    }

    #[test]
    fn serde_formatters_round_trip_a_struct() {
        let note = Note {
            title: "a <b> & \"c\" 'd'".into(),
            body: String::new(),
            tags: vec!["x".into(), "".into(), " y ".into()],
            n: -42,
        };
        let fs: [&dyn Formatter<Note>; 3] = [&BinaryFormatter, &XmlFormatter, &JsonFormatter];
        for f in fs {
            let bytes = f.encode(&note).unwrap();
            assert_eq!(f.decode(&bytes).unwrap(), note, "{}", f.body_type());
            assert_eq!(f.decode_tagged(&bytes, f.body_type()).unwrap(), note);
        }
    }

    #[test]
    fn xml_root_element_is_named_after_the_type() {
        let s = Formatter::<String>::encode(&XmlFormatter, &"hi".to_string()).unwrap();
        assert_eq!(&s[..], b"<String>hi</String>");
        let i = Formatter::<i32>::encode(&XmlFormatter, &-7).unwrap();
        assert_eq!(&i[..], b"<i32>-7</i32>");
        let u = Formatter::<()>::encode(&XmlFormatter, &()).unwrap();
        assert_eq!(&u[..], b"<unit/>");
        let e = Formatter::<i32>::decode(&XmlFormatter, b"<i64>5</i64>").unwrap_err();
        assert!(e.to_string().contains("root element is <i64>"), "{e}");
        // A prolog (declaration, comment, whitespace) before the root is accepted.
        let v: i32 = XmlFormatter
            .decode(b"<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<!-- n -->\n<i32>5</i32>")
            .unwrap();
        assert_eq!(v, 5);
        let s: String = XmlFormatter
            .decode(b"<?xml version=\"1.0\"?>\r\n<String> a </String>")
            .unwrap();
        assert_eq!(s, " a ");
    }

    #[test]
    fn xml_rejects_control_characters_with_a_clear_error() {
        let e = Formatter::<String>::encode(&XmlFormatter, &"a\u{1}b".to_string()).unwrap_err();
        assert!(matches!(e, FormatError::Encode { .. }));
        assert!(e.to_string().contains("U+0001"), "{e}");
        let e = Formatter::<String>::encode(&XmlFormatter, &"\u{FFFF}".to_string()).unwrap_err();
        assert!(e.to_string().contains("U+FFFF"), "{e}");
        let e = Formatter::<String>::decode(&XmlFormatter, b"<String>\x1b</String>").unwrap_err();
        assert!(matches!(e, FormatError::Decode { .. }), "{e}");
        // Tab, LF, CR and whitespace-only strings are fine.
        for s in ["\t", "\n", "\r", "\r\n", " ", "  a  "] {
            let b = Formatter::<String>::encode(&XmlFormatter, &s.to_string()).unwrap();
            assert_eq!(Formatter::<String>::decode(&XmlFormatter, &b).unwrap(), s);
        }
    }

    #[test]
    fn wrong_body_type_and_garbage_are_errors() {
        let b = Formatter::<i64>::encode(&JsonFormatter, &5).unwrap();
        assert!(matches!(
            Formatter::<i64>::decode_tagged(&XmlFormatter, &b, BodyType::Json),
            Err(FormatError::WrongBodyType {
                expected: BodyType::Xml,
                found: BodyType::Json
            })
        ));
        assert!(Formatter::<i64>::decode(&XmlFormatter, &b).is_err());
        assert!(Formatter::<i64>::decode(&JsonFormatter, b"5 6").is_err());
        assert!(Formatter::<Note>::decode(&BinaryFormatter, &[0xFF; 3]).is_err());
        assert!(Formatter::<String>::decode(&RawFormatter, &[0xC3]).is_err());
        let e = Formatter::<i64>::decode(&BinaryFormatter, &[2, 0]).unwrap_err();
        assert!(e.to_string().contains("trailing"), "{e}");
    }

    #[test]
    fn raw_formatter_passes_bytes_through() {
        let b = Bytes::from_static(b"\x00\xFFabc");
        assert_eq!(RawFormatter.encode(&b).unwrap(), b);
        assert_eq!(Formatter::<Bytes>::decode(&RawFormatter, &b).unwrap(), b);
        let v = b.to_vec();
        assert_eq!(&RawFormatter.encode(&v).unwrap()[..], &v[..]);
        assert_eq!(Formatter::<Vec<u8>>::decode(&RawFormatter, &v).unwrap(), v);
        let s = "grüße".to_string();
        assert_eq!(&RawFormatter.encode(&s).unwrap()[..], s.as_bytes());
        assert_eq!(
            Formatter::<String>::decode(&RawFormatter, s.as_bytes()).unwrap(),
            s
        );
    }

    #[test]
    fn manual_primitives_layout() {
        let b = ManualFormatter.encode(&"ab".to_string()).unwrap();
        assert_eq!(&b[..], &[2, 0, 0, 0, b'a', b'b']);
        assert_eq!(
            &ManualFormatter.encode(&-2i32).unwrap()[..],
            &[0xFE, 0xFF, 0xFF, 0xFF]
        );
        assert_eq!(ManualFormatter.encode(&1i64).unwrap().len(), 8);
        let v = vec![1i32, 2];
        let b = ManualFormatter.encode(&v).unwrap();
        assert_eq!(&b[..], &[2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(
            Formatter::<Vec<i32>>::decode(&ManualFormatter, &b).unwrap(),
            v
        );
        // A huge count with no data fails cleanly instead of allocating.
        let e =
            Formatter::<Vec<i64>>::decode(&ManualFormatter, &[0xFF, 0xFF, 0xFF, 0xFF]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        let e = Formatter::<String>::decode(&ManualFormatter, &[1, 0, 0, 0, 0xFF]).unwrap_err();
        assert!(e.to_string().contains("UTF-8"), "{e}");
    }

    proptest! {
        #[test]
        fn xml_round_trips_any_string_xml_can_carry(s in any::<String>()) {
            let r = Formatter::<String>::encode(&XmlFormatter, &s);
            if s.chars().all(is_xml_char) {
                let b = r.unwrap();
                prop_assert_eq!(Formatter::<String>::decode(&XmlFormatter, &b).unwrap(), s);
            } else {
                prop_assert!(matches!(r, Err(FormatError::Encode { .. })), "{:?}", r);
            }
        }

        #[test]
        fn xml_round_trips_markup_heavy_strings_in_structs(
            title in "[<>&\"' \\t\\r\\na-zé€😀\\]]{0,40}",
            body in "\\PC{0,40}",
            tags in proptest::collection::vec("[<&>'\" x]{0,5}", 0..4),
            n in any::<i64>(),
        ) {
            let note = Note { title, body, tags, n };
            let b = Formatter::<Note>::encode(&XmlFormatter, &note).unwrap();
            prop_assert_eq!(Formatter::<Note>::decode(&XmlFormatter, &b).unwrap(), note);
        }

        #[test]
        fn manual_strings_reject_truncation_and_trailing_bytes(
            s in any::<String>(), cut in any::<prop::sample::Index>(), extra in 1usize..8,
        ) {
            let b = ManualFormatter.encode(&s).unwrap();
            prop_assert_eq!(&Formatter::<String>::decode(&ManualFormatter, &b).unwrap(), &s);
            let cut = cut.index(b.len());
            prop_assert!(Formatter::<String>::decode(&ManualFormatter, &b[..cut]).is_err());
            let mut longer = b.to_vec();
            longer.extend(std::iter::repeat_n(0u8, extra));
            prop_assert!(Formatter::<String>::decode(&ManualFormatter, &longer).is_err());
        }

        #[test]
        fn manual_ints_round_trip_and_reject_bad_lengths(a in any::<i32>(), b in any::<i64>()) {
            let ea = ManualFormatter.encode(&a).unwrap();
            let eb = ManualFormatter.encode(&b).unwrap();
            prop_assert_eq!(Formatter::<i32>::decode(&ManualFormatter, &ea).unwrap(), a);
            prop_assert_eq!(Formatter::<i64>::decode(&ManualFormatter, &eb).unwrap(), b);
            prop_assert!(Formatter::<i32>::decode(&ManualFormatter, &ea[..3]).is_err());
            prop_assert!(Formatter::<i32>::decode(&ManualFormatter, &eb).is_err());
            prop_assert!(Formatter::<i64>::decode(&ManualFormatter, &eb[..7]).is_err());
        }

        #[test]
        fn binary_and_json_round_trip_any_string(s in any::<String>()) {
            let b = Formatter::<String>::encode(&BinaryFormatter, &s).unwrap();
            prop_assert_eq!(&Formatter::<String>::decode(&BinaryFormatter, &b).unwrap(), &s);
            let j = Formatter::<String>::encode(&JsonFormatter, &s).unwrap();
            prop_assert_eq!(&Formatter::<String>::decode(&JsonFormatter, &j).unwrap(), &s);
        }
    }
}
