//! The benchmark payloads of the "System.Messaging performance" white paper, and the glue
//! `mqperf` calls per message ([`encode`], [`decode`]).
//!
//! Payloads: `empty` (no body), `string:N` (N ASCII characters, so N bytes of UTF-8; the
//! paper's sizes are [`STRING_SIZES`]), `xml` (a purchase-order XML document of about 3 KB,
//! carried as a string), `order` (an [`Order`] with 50 [`LineItem`]s, the paper's
//! serialized-object test) and `int` (one `i32`).
//!
//! Which formatter carries what:
//!
//! | payload   | raw                   | manual            | binary / xml / json            |
//! |-----------|-----------------------|-------------------|--------------------------------|
//! | empty     | 0 bytes               | 0 bytes           | the unit value `()` (postcard: 0 bytes, JSON `null`, XML `<unit/>`) |
//! | string    | UTF-8 bytes           | u32 length + UTF-8 | the string                    |
//! | xml       | UTF-8 bytes           | u32 length + UTF-8 | the string (XML: escaped inside `<String>`) |
//! | order     | **Unsupported**       | [`ManualEncode`]  | serde                          |
//! | int       | 4 bytes little-endian | 4 bytes little-endian | the integer                |

use std::fmt::Write as _;
use std::str::FromStr;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use mq_client::formatter::{
    BinaryFormatter, BodyType, FormatError, Formatter, JsonFormatter, ManualEncode,
    ManualFormatter, RawFormatter, XmlFormatter,
};

/// The string lengths of the white paper's transport test, in characters (= bytes).
pub const STRING_SIZES: [usize; 7] = [500, 1000, 2000, 10_000, 100_000, 1_000_000, 2_000_000];
/// Line items in the `order` payload, as in the white paper.
pub const ORDER_LINE_ITEMS: usize = 50;
/// Seed of the `order` payload.
pub const ORDER_SEED: u64 = 2003;
/// Largest `string:N` accepted by [`PayloadKind::parse_list`] (64 MiB), to catch typos
/// before they allocate gigabytes.
pub const MAX_STRING_CHARS: usize = 64 << 20;

// ---------------------------------------------------------------------------------------------
// The Order object (fields as in the white paper's C# classes)

/// A postal address (the white paper's `Address` class).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Address {
    pub first_name: String,
    pub last_name: String,
    pub company: String,
    pub street: String,
    pub city: String,
    pub zip: String,
    pub state: String,
    pub country: String,
}

/// One order line (the white paper's `LineItem` class).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineItem {
    pub article_id: i32,
    pub description: String,
    pub quantity: f64,
    pub unit_price: f64,
    /// `quantity * unit_price`, rounded to cents.
    pub line_total: f64,
}

/// A purchase order (the white paper's `Order` class).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    /// Order date, milliseconds since the Unix epoch (UTC).
    pub date_unix_ms: i64,
    pub customer_id: i32,
    pub shipping_address: Address,
    pub billing_address: Address,
    /// Sum of the line totals.
    pub total: f64,
    #[serde(default)]
    pub line_items: Vec<LineItem>,
}

/// splitmix64: small, fast, deterministic on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const FIRST_NAMES: &[&str] = &[
    "Anna", "Ben", "Chloé", "David", "Elena", "Felix", "Greta", "Hannah", "Jonas", "Katrin",
    "Lukas", "Mia", "Noah", "Olivia", "Paul", "Sofia",
];
const LAST_NAMES: &[&str] = &[
    "Müller",
    "Schmidt",
    "Schneider",
    "Fischer",
    "Weber",
    "Meyer",
    "Wagner",
    "Becker",
    "O'Brien",
    "Smith",
    "Johnson",
    "Garcia",
    "Martin",
    "Rossi",
    "Novák",
    "Jensen",
];
const COMPANIES: &[&str] = &[
    "Contoso Ltd.",
    "Fabrikam, Inc.",
    "Northwind Traders",
    "Adventure Works",
    "Tailspin Toys",
    "Smith & Sons",
    "Litware GmbH",
    "Wide World Importers",
];
const STREETS: &[&str] = &[
    "Main Street",
    "Hauptstraße",
    "Oak Avenue",
    "Bahnhofstraße",
    "Elm Road",
    "Rue de la Paix",
    "Market Square",
    "Lindenweg",
];
const CITIES: &[(&str, &str, &str)] = &[
    ("Seattle", "WA", "USA"),
    ("Redmond", "WA", "USA"),
    ("München", "BY", "Germany"),
    ("Berlin", "BE", "Germany"),
    ("Wien", "W", "Austria"),
    ("Zürich", "ZH", "Switzerland"),
    ("Portland", "OR", "USA"),
    ("Hamburg", "HH", "Germany"),
];
const ADJECTIVES: &[&str] = &[
    "Stainless",
    "Galvanized",
    "Heavy-duty",
    "Compact",
    "Ergonomic",
    "Wireless",
    "Premium",
    "Recycled",
];
const PRODUCTS: &[&str] = &[
    "hex bolt M8x40 (box of 100)",
    "cordless drill 18V",
    "office chair",
    "USB-C docking station",
    "A4 copy paper, 500 sheets",
    "LED desk lamp",
    "safety gloves, size L",
    "mechanical keyboard",
    "cable ties 200 mm",
    "whiteboard 120x90 cm",
];

/// 2003-03-28 00:00 UTC (the white paper's date), in milliseconds since the Unix epoch.
const BASE_DATE_MS: i64 = 1_048_809_600_000;

impl Address {
    fn sample(rng: &mut Rng) -> Address {
        let (city, state, country) = CITIES[rng.below(CITIES.len() as u64) as usize];
        Address {
            first_name: rng.pick(FIRST_NAMES).to_string(),
            last_name: rng.pick(LAST_NAMES).to_string(),
            company: rng.pick(COMPANIES).to_string(),
            street: format!("{} {}", rng.pick(STREETS), 1 + rng.below(250)),
            city: city.to_string(),
            zip: format!("{:05}", 1000 + rng.below(98_000)),
            state: state.to_string(),
            country: country.to_string(),
        }
    }
}

impl Order {
    /// A deterministic order with `line_items` lines: the same `(line_items, seed)` always
    /// gives the same order. Prices are whole cents, quantities whole numbers, and the line
    /// totals and the total are computed in cents, so every float is exact to the cent.
    pub fn sample(line_items: usize, seed: u64) -> Order {
        let mut rng = Rng(seed);
        let shipping_address = Address::sample(&mut rng);
        let billing_address = if rng.below(3) == 0 {
            shipping_address.clone()
        } else {
            Address::sample(&mut rng)
        };
        let mut total_cents: i64 = 0;
        let items = (0..line_items)
            .map(|_| {
                let quantity = 1 + rng.below(20) as i64;
                let price_cents = 99 + rng.below(50_000) as i64;
                let line_cents = quantity * price_cents;
                total_cents += line_cents;
                LineItem {
                    article_id: 100_000 + rng.below(900_000) as i32,
                    description: format!("{} {}", rng.pick(ADJECTIVES), rng.pick(PRODUCTS)),
                    quantity: quantity as f64,
                    unit_price: price_cents as f64 / 100.0,
                    line_total: line_cents as f64 / 100.0,
                }
            })
            .collect();
        Order {
            date_unix_ms: BASE_DATE_MS + rng.below(365 * 86_400_000) as i64,
            customer_id: 1 + rng.below(999_999) as i32,
            shipping_address,
            billing_address,
            total: total_cents as f64 / 100.0,
            line_items: items,
        }
    }
}

// Manual (BinaryWriter-style) encodings: fields in declaration order.

impl ManualEncode for Address {
    fn encode_manual(&self, out: &mut Vec<u8>) {
        self.first_name.encode_manual(out);
        self.last_name.encode_manual(out);
        self.company.encode_manual(out);
        self.street.encode_manual(out);
        self.city.encode_manual(out);
        self.zip.encode_manual(out);
        self.state.encode_manual(out);
        self.country.encode_manual(out);
    }

    fn decode_manual(input: &mut &[u8]) -> Result<Self, FormatError> {
        Ok(Address {
            first_name: String::decode_manual(input)?,
            last_name: String::decode_manual(input)?,
            company: String::decode_manual(input)?,
            street: String::decode_manual(input)?,
            city: String::decode_manual(input)?,
            zip: String::decode_manual(input)?,
            state: String::decode_manual(input)?,
            country: String::decode_manual(input)?,
        })
    }

    fn manual_size_hint(&self) -> usize {
        8 * 4
            + self.first_name.len()
            + self.last_name.len()
            + self.company.len()
            + self.street.len()
            + self.city.len()
            + self.zip.len()
            + self.state.len()
            + self.country.len()
    }
}

impl ManualEncode for LineItem {
    fn encode_manual(&self, out: &mut Vec<u8>) {
        self.article_id.encode_manual(out);
        self.description.encode_manual(out);
        self.quantity.encode_manual(out);
        self.unit_price.encode_manual(out);
        self.line_total.encode_manual(out);
    }

    fn decode_manual(input: &mut &[u8]) -> Result<Self, FormatError> {
        Ok(LineItem {
            article_id: i32::decode_manual(input)?,
            description: String::decode_manual(input)?,
            quantity: f64::decode_manual(input)?,
            unit_price: f64::decode_manual(input)?,
            line_total: f64::decode_manual(input)?,
        })
    }

    fn manual_size_hint(&self) -> usize {
        4 + 4 + self.description.len() + 3 * 8
    }
}

impl ManualEncode for Order {
    fn encode_manual(&self, out: &mut Vec<u8>) {
        self.date_unix_ms.encode_manual(out);
        self.customer_id.encode_manual(out);
        self.shipping_address.encode_manual(out);
        self.billing_address.encode_manual(out);
        self.total.encode_manual(out);
        self.line_items.encode_manual(out);
    }

    fn decode_manual(input: &mut &[u8]) -> Result<Self, FormatError> {
        Ok(Order {
            date_unix_ms: i64::decode_manual(input)?,
            customer_id: i32::decode_manual(input)?,
            shipping_address: Address::decode_manual(input)?,
            billing_address: Address::decode_manual(input)?,
            total: f64::decode_manual(input)?,
            line_items: Vec::<LineItem>::decode_manual(input)?,
        })
    }

    fn manual_size_hint(&self) -> usize {
        8 + 4
            + self.shipping_address.manual_size_hint()
            + self.billing_address.manual_size_hint()
            + 8
            + self.line_items.manual_size_hint()
    }
}

// ---------------------------------------------------------------------------------------------
// Payload kinds and payloads

/// Which payload to send (parsed from the command line).
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadKind {
    /// No body.
    Empty,
    /// A string of this many ASCII characters.
    Str(usize),
    /// A purchase-order XML document, sent as a string.
    Xml,
    /// An [`Order`] object with [`ORDER_LINE_ITEMS`] line items.
    Order,
    /// One `i32`.
    Int,
}

impl PayloadKind {
    /// `"empty"`, `"string:1000"`, `"xml"`, `"order"`, `"int"`.
    pub fn name(&self) -> String {
        match self {
            PayloadKind::Empty => "empty".into(),
            PayloadKind::Str(n) => format!("string:{n}"),
            PayloadKind::Xml => "xml".into(),
            PayloadKind::Order => "order".into(),
            PayloadKind::Int => "int".into(),
        }
    }

    /// Everything: empty, the seven strings, xml, order, int.
    pub fn all() -> Vec<PayloadKind> {
        let mut v = vec![PayloadKind::Empty];
        v.extend(STRING_SIZES.iter().map(|&n| PayloadKind::Str(n)));
        v.extend([PayloadKind::Xml, PayloadKind::Order, PayloadKind::Int]);
        v
    }

    /// Parses a comma-separated list of `empty`, `string:N`, `strings` (the seven sizes of
    /// [`STRING_SIZES`]), `xml`, `order`, `int`, `all` (= empty, strings, xml, order, int).
    /// Case-insensitive, whitespace around items ignored, duplicates dropped (first wins).
    pub fn parse_list(s: &str) -> Result<Vec<PayloadKind>, String> {
        const CHOICES: &str = "empty, string:N, strings, xml, order, int, all";
        let mut out: Vec<PayloadKind> = Vec::new();
        for raw in s.split(',') {
            let item = raw.trim().to_ascii_lowercase();
            let kinds = match item.as_str() {
                "" => {
                    return Err(format!(
                        "empty item in payload list `{s}` (choose from: {CHOICES})"
                    ));
                }
                "empty" => vec![PayloadKind::Empty],
                "strings" => STRING_SIZES.iter().map(|&n| PayloadKind::Str(n)).collect(),
                "xml" => vec![PayloadKind::Xml],
                "order" => vec![PayloadKind::Order],
                "int" => vec![PayloadKind::Int],
                "all" => PayloadKind::all(),
                other => match other.strip_prefix("string:") {
                    Some(n) => {
                        let n: usize = n.trim().replace('_', "").parse().map_err(|_| {
                            format!("bad string length in `{}`: expected string:N with N a whole number of characters", raw.trim())
                        })?;
                        if n > MAX_STRING_CHARS {
                            return Err(format!(
                                "string:{n} is too long (at most {MAX_STRING_CHARS} characters)"
                            ));
                        }
                        vec![PayloadKind::Str(n)]
                    }
                    None => {
                        return Err(format!(
                            "unknown payload `{}` (choose from: {CHOICES})",
                            raw.trim()
                        ));
                    }
                },
            };
            for k in kinds {
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        Ok(out)
    }
}

/// A message body before formatting. The `xml` payload is `Str(the XML text)`.
// One payload is built per run and borrowed per message, so the size of the Order variant
// costs nothing; boxing it would only make matching clumsier.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Empty,
    Str(String),
    Order(Order),
    Int(i32),
}

impl Payload {
    /// Builds the (deterministic) payload of a kind.
    pub fn make(kind: &PayloadKind) -> Payload {
        match kind {
            PayloadKind::Empty => Payload::Empty,
            PayloadKind::Str(n) => Payload::Str(ascii_text(*n)),
            PayloadKind::Xml => Payload::Str(purchase_order_xml()),
            PayloadKind::Order => Payload::Order(Order::sample(ORDER_LINE_ITEMS, ORDER_SEED)),
            PayloadKind::Int => Payload::Int(0x1234_5678),
        }
    }

    /// `"empty"`, `"string"`, `"order"`, `"int"` (for messages).
    pub fn variant_name(&self) -> &'static str {
        match self {
            Payload::Empty => "empty",
            Payload::Str(_) => "string",
            Payload::Order(_) => "order",
            Payload::Int(_) => "int",
        }
    }
}

/// `n` printable ASCII characters (a repeated sentence, no XML/JSON special characters).
pub fn ascii_text(n: usize) -> String {
    const PATTERN: &[u8] = b"The quick brown fox jumps over the lazy dog 0123456789. ";
    let bytes: Vec<u8> = PATTERN.iter().copied().cycle().take(n).collect();
    String::from_utf8(bytes).expect("ASCII")
}

/// Appends `s` with XML text/attribute escaping.
fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
}

fn push_element(out: &mut String, indent: &str, name: &str, value: &str) {
    let _ = write!(out, "{indent}<{name}>");
    push_escaped(out, value);
    let _ = writeln!(out, "</{name}>");
}

fn push_address(out: &mut String, name: &str, a: &Address) {
    let _ = writeln!(out, "  <{name}>");
    push_element(out, "    ", "Firstname", &a.first_name);
    push_element(out, "    ", "Lastname", &a.last_name);
    push_element(out, "    ", "Company", &a.company);
    push_element(out, "    ", "Street", &a.street);
    push_element(out, "    ", "City", &a.city);
    push_element(out, "    ", "ZIPCode", &a.zip);
    push_element(out, "    ", "State", &a.state);
    push_element(out, "    ", "Country", &a.country);
    let _ = writeln!(out, "  </{name}>");
}

/// The `xml` payload: a purchase order with 10 line items as a .NET `XmlSerializer` would
/// write it (declaration, namespaces, indentation), about 3 KB of UTF-8. Deterministic.
pub fn purchase_order_xml() -> String {
    let o = Order::sample(10, ORDER_SEED);
    let mut x = String::with_capacity(4096);
    x.push_str("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n");
    x.push_str(
        "<Order xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" \
         xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\">\n",
    );
    // Date as ISO 8601 (UTC), derived from the Unix milliseconds.
    let secs = o.date_unix_ms.div_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let date = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    );
    push_element(&mut x, "  ", "Date", &date);
    push_element(&mut x, "  ", "CustomerID", &o.customer_id.to_string());
    push_address(&mut x, "ShippingAddress", &o.shipping_address);
    push_address(&mut x, "BillingAddress", &o.billing_address);
    push_element(&mut x, "  ", "Total", &format!("{:.2}", o.total));
    x.push_str("  <LineItems>\n");
    for li in &o.line_items {
        x.push_str("    <LineItem>\n");
        push_element(&mut x, "      ", "ArticleID", &li.article_id.to_string());
        push_element(&mut x, "      ", "Name", &li.description);
        push_element(&mut x, "      ", "Price", &format!("{:.2}", li.unit_price));
        push_element(&mut x, "      ", "Quantity", &li.quantity.to_string());
        push_element(
            &mut x,
            "      ",
            "LineTotal",
            &format!("{:.2}", li.line_total),
        );
        x.push_str("    </LineItem>\n");
    }
    x.push_str("  </LineItems>\n</Order>\n");
    x
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

// ---------------------------------------------------------------------------------------------
// Formatter kinds and the per-message glue

/// Which formatter `mqperf` uses (parsed from the command line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatterKind {
    Binary,
    Xml,
    Json,
    Raw,
    Manual,
}

impl FormatterKind {
    /// All kinds, in the order `all` expands to.
    pub const ALL: [FormatterKind; 5] = [
        FormatterKind::Binary,
        FormatterKind::Xml,
        FormatterKind::Json,
        FormatterKind::Raw,
        FormatterKind::Manual,
    ];

    /// `"binary"`, `"xml"`, `"json"`, `"raw"`, `"manual"`.
    pub fn name(&self) -> &'static str {
        self.body_type().name()
    }

    /// The body-type tag messages encoded with this formatter carry.
    pub fn body_type(&self) -> BodyType {
        match self {
            FormatterKind::Binary => BodyType::Binary,
            FormatterKind::Xml => BodyType::Xml,
            FormatterKind::Json => BodyType::Json,
            FormatterKind::Raw => BodyType::Raw,
            FormatterKind::Manual => BodyType::Manual,
        }
    }

    /// Parses a comma-separated list of `binary`, `xml`, `json`, `raw`, `manual`, `all`.
    /// Case-insensitive, duplicates dropped (first wins).
    pub fn parse_list(s: &str) -> Result<Vec<FormatterKind>, String> {
        let mut out: Vec<FormatterKind> = Vec::new();
        for item in s.split(',') {
            let kinds: Vec<FormatterKind> = if item.trim().eq_ignore_ascii_case("all") {
                FormatterKind::ALL.to_vec()
            } else {
                vec![item.parse()?]
            };
            for k in kinds {
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        Ok(out)
    }
}

impl FromStr for FormatterKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        FormatterKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(t))
            .ok_or_else(|| {
                format!(
                    "unknown formatter `{t}` (choose from: binary, xml, json, raw, manual, all)"
                )
            })
    }
}

impl From<BodyType> for FormatterKind {
    fn from(b: BodyType) -> Self {
        match b {
            BodyType::Raw => FormatterKind::Raw,
            BodyType::Binary => FormatterKind::Binary,
            BodyType::Xml => FormatterKind::Xml,
            BodyType::Json => FormatterKind::Json,
            BodyType::Manual => FormatterKind::Manual,
        }
    }
}

fn raw_order_unsupported() -> FormatError {
    FormatError::Unsupported {
        formatter: "raw",
        what: "order".into(),
        reason: "the raw formatter carries bytes; an Order needs a serializing formatter".into(),
    }
}

fn serde_encode<T: Serialize + DeserializeOwned>(
    v: &T,
    f: FormatterKind,
) -> Result<Bytes, FormatError> {
    match f {
        FormatterKind::Binary => BinaryFormatter.encode(v),
        FormatterKind::Xml => XmlFormatter.encode(v),
        FormatterKind::Json => JsonFormatter.encode(v),
        FormatterKind::Raw | FormatterKind::Manual => {
            unreachable!("raw and manual are handled by the caller")
        }
    }
}

fn serde_decode<T: Serialize + DeserializeOwned>(
    body: &[u8],
    b: BodyType,
) -> Result<T, FormatError> {
    match b {
        BodyType::Binary => BinaryFormatter.decode(body),
        BodyType::Xml => XmlFormatter.decode(body),
        BodyType::Json => JsonFormatter.decode(body),
        BodyType::Raw | BodyType::Manual => {
            unreachable!("raw and manual are handled by the caller")
        }
    }
}

fn expect_empty(body: &[u8], formatter: &'static str) -> Result<Payload, FormatError> {
    if body.is_empty() {
        Ok(Payload::Empty)
    } else {
        Err(FormatError::Decode {
            formatter,
            reason: format!("expected an empty body, found {} byte(s)", body.len()),
        })
    }
}

/// Encodes a payload with a formatter kind; this is what mqperf calls per message.
/// Returns the body and the tag to send with it. `(Order, Raw)` is
/// [`FormatError::Unsupported`]; every other combination works.
pub fn encode(p: &Payload, f: FormatterKind) -> Result<(Bytes, BodyType), FormatError> {
    let bytes = match (p, f) {
        (Payload::Empty, FormatterKind::Raw | FormatterKind::Manual) => Bytes::new(),
        (Payload::Empty, _) => serde_encode(&(), f)?,
        (Payload::Str(s), FormatterKind::Raw) => RawFormatter.encode(s)?,
        (Payload::Str(s), FormatterKind::Manual) => ManualFormatter.encode(s)?,
        (Payload::Str(s), _) => serde_encode(s, f)?,
        (Payload::Order(_), FormatterKind::Raw) => return Err(raw_order_unsupported()),
        (Payload::Order(o), FormatterKind::Manual) => ManualFormatter.encode(o)?,
        (Payload::Order(o), _) => serde_encode(o, f)?,
        // Raw and manual agree for an int: 4 bytes little-endian.
        (Payload::Int(i), FormatterKind::Raw | FormatterKind::Manual) => {
            Bytes::copy_from_slice(&i.to_le_bytes())
        }
        (Payload::Int(i), _) => serde_encode(i, f)?,
    };
    Ok((bytes, f.body_type()))
}

/// Decodes a body that carries `body_type` into the same variant as `like` (the payload the
/// sender used; its contents are ignored). This is what mqperf calls per received message.
pub fn decode(body: &[u8], body_type: BodyType, like: &Payload) -> Result<Payload, FormatError> {
    let f = body_type.name();
    match (like, body_type) {
        (Payload::Empty, BodyType::Raw | BodyType::Manual) => expect_empty(body, f),
        (Payload::Empty, _) => serde_decode::<()>(body, body_type).map(|()| Payload::Empty),
        (Payload::Str(_), BodyType::Raw) => {
            Formatter::<String>::decode(&RawFormatter, body).map(Payload::Str)
        }
        (Payload::Str(_), BodyType::Manual) => {
            Formatter::<String>::decode(&ManualFormatter, body).map(Payload::Str)
        }
        (Payload::Str(_), _) => serde_decode(body, body_type).map(Payload::Str),
        (Payload::Order(_), BodyType::Raw) => Err(raw_order_unsupported()),
        (Payload::Order(_), BodyType::Manual) => ManualFormatter.decode(body).map(Payload::Order),
        (Payload::Order(_), _) => serde_decode(body, body_type).map(Payload::Order),
        (Payload::Int(_), BodyType::Raw | BodyType::Manual) => {
            let bytes: [u8; 4] = body.try_into().map_err(|_| FormatError::Decode {
                formatter: f,
                reason: format!("an int body is 4 bytes, found {}", body.len()),
            })?;
            Ok(Payload::Int(i32::from_le_bytes(bytes)))
        }
        (Payload::Int(_), _) => serde_decode(body, body_type).map(Payload::Int),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn manual_order_bytes(o: &Order) -> Bytes {
        ManualFormatter.encode(o).unwrap()
    }

    #[test]
    fn every_payload_with_every_formatter_round_trips_or_is_unsupported() {
        let mut checked = 0;
        for kind in PayloadKind::all() {
            let p = Payload::make(&kind);
            for f in FormatterKind::ALL {
                match encode(&p, f) {
                    Ok((body, bt)) => {
                        assert_eq!(bt, f.body_type());
                        let back = decode(&body, bt, &p)
                            .unwrap_or_else(|e| panic!("{} with {}: {e}", kind.name(), f.name()));
                        assert_eq!(back, p, "{} with {}", kind.name(), f.name());
                        checked += 1;
                    }
                    Err(e @ FormatError::Unsupported { .. }) => {
                        assert_eq!((&kind, f), (&PayloadKind::Order, FormatterKind::Raw));
                        assert!(e.to_string().contains("serializing formatter"), "{e}");
                        // The decoder agrees.
                        let d = decode(b"x", BodyType::Raw, &p).unwrap_err();
                        assert!(d.is_unsupported());
                    }
                    Err(e) => panic!("{} with {}: {e}", kind.name(), f.name()),
                }
            }
        }
        assert_eq!(checked, 11 * 5 - 1);
    }

    #[test]
    fn size_table() {
        let mut table = String::new();
        let _ = write!(table, "{:<16}", "payload");
        for f in FormatterKind::ALL {
            let _ = write!(table, "{:>12}", f.name());
        }
        table.push('\n');
        for kind in PayloadKind::all() {
            let p = Payload::make(&kind);
            let _ = write!(table, "{:<16}", kind.name());
            for f in FormatterKind::ALL {
                match encode(&p, f) {
                    Ok((b, _)) => {
                        let _ = write!(table, "{:>12}", b.len());
                    }
                    Err(_) => {
                        let _ = write!(table, "{:>12}", "unsupported");
                    }
                }
            }
            table.push('\n');
        }
        println!("{table}");

        let big = Payload::make(&PayloadKind::Str(2_000_000));
        for f in [FormatterKind::Xml, FormatterKind::Json] {
            let (b, _) = encode(&big, f).unwrap();
            assert!(b.len() < 4 << 20, "{}: {} bytes", f.name(), b.len());
        }
    }

    #[test]
    fn payload_shapes() {
        for n in STRING_SIZES {
            match Payload::make(&PayloadKind::Str(n)) {
                Payload::Str(s) => {
                    assert_eq!(s.len(), n);
                    assert_eq!(s.chars().count(), n);
                    assert!(s.is_ascii());
                }
                p => panic!("{p:?}"),
            }
        }
        let Payload::Str(xml) = Payload::make(&PayloadKind::Xml) else {
            panic!()
        };
        assert!(xml.starts_with("<?xml"));
        assert!((2_000..8_000).contains(&xml.len()), "{}", xml.len());
        assert_eq!(xml.matches("<LineItem>").count(), 10);
        // Elements nest properly (a small check that needs no XML parser in mq-perf).
        let mut open: Vec<&str> = Vec::new();
        for tag in xml.split('<').skip(1).map(|t| t.split('>').next().unwrap()) {
            if tag.starts_with('?') {
                continue;
            } else if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name));
            } else if !tag.ends_with('/') {
                open.push(tag.split(' ').next().unwrap());
            }
        }
        assert!(open.is_empty(), "{open:?}");
        assert!(!xml.contains("& "), "unescaped ampersand");
        assert_eq!(xml, purchase_order_xml());
    }

    #[test]
    fn order_sample_is_deterministic_with_50_line_items() {
        let Payload::Order(o) = Payload::make(&PayloadKind::Order) else {
            panic!()
        };
        assert_eq!(o.line_items.len(), 50);
        assert_eq!(o, Order::sample(50, ORDER_SEED));
        assert_ne!(o, Order::sample(50, ORDER_SEED + 1));
        let cents = |x: f64| (x * 100.0).round() as i64;
        let sum: i64 = o.line_items.iter().map(|l| cents(l.line_total)).sum();
        assert_eq!(sum, cents(o.total));
        for l in &o.line_items {
            assert_eq!(cents(l.line_total), cents(l.unit_price) * l.quantity as i64);
        }
        // Pin the bytes, so a change in the generator is noticed (sizes in mqperf results).
        let b = manual_order_bytes(&o);
        assert_eq!(b.len(), o.manual_size_hint());
        let again = manual_order_bytes(&Order::sample(50, ORDER_SEED));
        assert_eq!(b, again);
        assert_eq!(Order::sample(0, 1).line_items.len(), 0);
    }

    #[test]
    fn manual_order_rejects_every_truncation_and_trailing_bytes() {
        let o = Order::sample(50, ORDER_SEED);
        let b = manual_order_bytes(&o);
        for cut in 0..b.len() {
            let e = Formatter::<Order>::decode(&ManualFormatter, &b[..cut]).unwrap_err();
            assert!(e.to_string().contains("truncated"), "cut {cut}: {e}");
        }
        let mut longer = b.to_vec();
        longer.push(0);
        let e = Formatter::<Order>::decode(&ManualFormatter, &longer).unwrap_err();
        assert!(e.to_string().contains("1 trailing byte"), "{e}");
        assert_eq!(
            decode(&b, BodyType::Manual, &Payload::Order(o.clone())).unwrap(),
            Payload::Order(o)
        );
    }

    #[test]
    fn wrong_sizes_for_empty_and_int_are_errors() {
        assert!(decode(b"x", BodyType::Raw, &Payload::Empty).is_err());
        assert!(decode(b"x", BodyType::Manual, &Payload::Empty).is_err());
        assert!(decode(&[1, 2, 3], BodyType::Raw, &Payload::Int(0)).is_err());
        assert!(decode(&[1, 2, 3, 4, 5], BodyType::Manual, &Payload::Int(0)).is_err());
        assert!(decode(b"\xFF", BodyType::Raw, &Payload::Str(String::new())).is_err());
        assert!(decode(b"[]", BodyType::Json, &Payload::Int(0)).is_err());
    }

    #[test]
    fn parse_lists() {
        assert_eq!(
            PayloadKind::parse_list("empty, string:1000,xml,ORDER,int").unwrap(),
            vec![
                PayloadKind::Empty,
                PayloadKind::Str(1000),
                PayloadKind::Xml,
                PayloadKind::Order,
                PayloadKind::Int
            ]
        );
        let all = PayloadKind::parse_list("all").unwrap();
        assert_eq!(all.len(), 11);
        assert_eq!(all, PayloadKind::all());
        let strings = PayloadKind::parse_list("strings,string:500").unwrap();
        assert_eq!(strings.len(), 7);
        assert_eq!(strings[0], PayloadKind::Str(500));
        for k in &all {
            assert_eq!(PayloadKind::parse_list(&k.name()).unwrap(), vec![k.clone()]);
        }
        for bad in [
            "",
            "str",
            "string:",
            "string:-1",
            "string:x",
            "xml,,int",
            "string:99999999999",
        ] {
            let e = PayloadKind::parse_list(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(PayloadKind::parse_list("bogus")
            .unwrap_err()
            .contains("string:N"));

        assert_eq!(
            FormatterKind::parse_list("all").unwrap(),
            FormatterKind::ALL.to_vec()
        );
        assert_eq!(
            FormatterKind::parse_list("xml, Manual,xml").unwrap(),
            vec![FormatterKind::Xml, FormatterKind::Manual]
        );
        let e = FormatterKind::parse_list("binary,soap").unwrap_err();
        assert!(e.contains("`soap`") && e.contains("manual"), "{e}");
        for f in FormatterKind::ALL {
            assert_eq!(FormatterKind::from(f.body_type()), f);
            assert_eq!(f.name().parse::<FormatterKind>().unwrap(), f);
        }
    }

    #[test]
    fn xml_payload_survives_every_serde_formatter() {
        let p = Payload::make(&PayloadKind::Xml);
        let (b, bt) = encode(&p, FormatterKind::Xml).unwrap();
        let text = std::str::from_utf8(&b).unwrap();
        assert!(text.starts_with("<String>&lt;?xml"), "{}", &text[..40]);
        assert_eq!(decode(&b, bt, &p).unwrap(), p);
    }

    proptest! {
        #[test]
        fn manual_order_rejects_truncation_and_trailing_bytes(
            seed in any::<u64>(),
            lines in 0usize..12,
            cut in any::<prop::sample::Index>(),
            extra in proptest::collection::vec(any::<u8>(), 1..16),
        ) {
            let o = Order::sample(lines, seed);
            let b = manual_order_bytes(&o);
            prop_assert_eq!(b.len(), o.manual_size_hint());
            prop_assert_eq!(&Formatter::<Order>::decode(&ManualFormatter, &b).unwrap(), &o);
            let cut = cut.index(b.len());
            let truncated = Formatter::<Order>::decode(&ManualFormatter, &b[..cut]);
            prop_assert!(matches!(truncated, Err(FormatError::Decode { .. })), "{:?}", truncated);
            let mut longer = b.to_vec();
            longer.extend_from_slice(&extra);
            let trailing = Formatter::<Order>::decode(&ManualFormatter, &longer);
            prop_assert!(matches!(trailing, Err(FormatError::Decode { .. })), "{:?}", trailing);
        }

        #[test]
        fn orders_round_trip_with_every_serializing_formatter(seed in any::<u64>(), lines in 0usize..8) {
            let p = Payload::Order(Order::sample(lines, seed));
            for f in [FormatterKind::Binary, FormatterKind::Xml, FormatterKind::Json, FormatterKind::Manual] {
                let (b, bt) = encode(&p, f).unwrap();
                prop_assert_eq!(&decode(&b, bt, &p).unwrap(), &p);
            }
        }
    }
}
