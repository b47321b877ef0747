//! Postgres's binary COPY format decoded straight into Arrow builders.
//!
//! The source reads a table with `COPY (SELECT ...) TO STDOUT (FORMAT binary)`
//! because it is the cheapest way out of Postgres: no text parsing, values in
//! network byte order. Each column's Arrow type follows the type Postgres
//! declares for it; types without a binary decoder here are selected as
//! `::text` and arrive as strings.

use std::io::{self, BufRead, Read};
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder,
    Float32Builder, Float64Builder, Int16Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::ArrayRef;
use arrow_schema::{DataType, Field, TimeUnit};

/// Microseconds from 1970-01-01 to Postgres's epoch, 2000-01-01.
const PG_EPOCH_US: i64 = 946_684_800_000_000;
/// Days from 1970-01-01 to 2000-01-01.
const PG_EPOCH_DAYS: i32 = 10_957;
const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("reading the COPY stream: {0}")]
    Io(#[from] io::Error),
    #[error("the COPY stream does not start with the binary signature")]
    Signature,
    #[error("a row has {got} fields, the query selects {want}")]
    FieldCount { got: i16, want: usize },
    #[error("column {column}: {reason}")]
    Value { column: String, reason: String },
}

/// How a column is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PgKind {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    /// text, varchar, bpchar, name, json, and anything selected as `::text`.
    Text,
    Jsonb,
    Bytea,
    Date,
    Timestamp,
    TimestampTz,
    Uuid,
    Numeric {
        precision: u8,
        scale: i8,
    },
}

impl PgKind {
    /// The kind for a column of type `oid` with modifier `typmod`; `None`
    /// means the column is selected as `::text`.
    pub fn of(oid: u32, typmod: i32) -> Option<PgKind> {
        Some(match oid {
            16 => PgKind::Bool,
            21 => PgKind::Int2,
            23 => PgKind::Int4,
            20 => PgKind::Int8,
            700 => PgKind::Float4,
            701 => PgKind::Float8,
            25 | 1043 | 1042 | 19 | 114 => PgKind::Text,
            3802 => PgKind::Jsonb,
            17 => PgKind::Bytea,
            1082 => PgKind::Date,
            1114 => PgKind::Timestamp,
            1184 => PgKind::TimestampTz,
            2950 => PgKind::Uuid,
            // numeric(p, s) with p <= 38 fits Decimal128; an unconstrained
            // numeric has no fixed scale, so it travels as text.
            1700 if typmod >= 4 => {
                let precision = ((typmod - 4) >> 16) & 0xffff;
                let scale = (typmod - 4) & 0xffff;
                if !(1..=38).contains(&precision) || scale > precision {
                    return None;
                }
                PgKind::Numeric {
                    precision: precision as u8,
                    scale: scale as i8,
                }
            }
            _ => return None,
        })
    }

    pub fn data_type(self) -> DataType {
        match self {
            PgKind::Bool => DataType::Boolean,
            PgKind::Int2 => DataType::Int16,
            PgKind::Int4 => DataType::Int32,
            PgKind::Int8 => DataType::Int64,
            PgKind::Float4 => DataType::Float32,
            PgKind::Float8 => DataType::Float64,
            PgKind::Text | PgKind::Jsonb | PgKind::Uuid => DataType::Utf8,
            PgKind::Bytea => DataType::Binary,
            PgKind::Date => DataType::Date32,
            PgKind::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            PgKind::TimestampTz => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            PgKind::Numeric { precision, scale } => DataType::Decimal128(precision, scale),
        }
    }
}

/// A column of the query: its name and how it is read.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PgColumn {
    pub name: String,
    pub kind: PgKind,
    pub nullable: bool,
}

impl PgColumn {
    pub fn field(&self) -> Field {
        Field::new(&self.name, self.kind.data_type(), self.nullable)
    }
}

enum Builder {
    Bool(BooleanBuilder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Str(StringBuilder),
    Bin(BinaryBuilder),
    Date(Date32Builder),
    Ts(TimestampMicrosecondBuilder),
    Dec(Decimal128Builder),
}

fn be<const N: usize>(v: &[u8]) -> Option<[u8; N]> {
    v.try_into().ok()
}

impl Builder {
    fn new(kind: PgKind, rows: usize) -> Builder {
        Builder::with_capacity(kind, rows, rows * 16)
    }

    /// A builder with room for `rows` values and, for text and bytes,
    /// `bytes` of them.
    fn with_capacity(kind: PgKind, rows: usize, bytes: usize) -> Builder {
        match kind {
            PgKind::Bool => Builder::Bool(BooleanBuilder::with_capacity(rows)),
            PgKind::Int2 => Builder::I16(Int16Builder::with_capacity(rows)),
            PgKind::Int4 => Builder::I32(Int32Builder::with_capacity(rows)),
            PgKind::Int8 => Builder::I64(Int64Builder::with_capacity(rows)),
            PgKind::Float4 => Builder::F32(Float32Builder::with_capacity(rows)),
            PgKind::Float8 => Builder::F64(Float64Builder::with_capacity(rows)),
            PgKind::Text | PgKind::Jsonb | PgKind::Uuid => {
                Builder::Str(StringBuilder::with_capacity(rows, bytes))
            }
            PgKind::Bytea => Builder::Bin(BinaryBuilder::with_capacity(rows, bytes)),
            PgKind::Date => Builder::Date(Date32Builder::with_capacity(rows)),
            PgKind::Timestamp => Builder::Ts(TimestampMicrosecondBuilder::with_capacity(rows)),
            PgKind::TimestampTz => {
                Builder::Ts(TimestampMicrosecondBuilder::with_capacity(rows).with_timezone("UTC"))
            }
            PgKind::Numeric { precision, scale } => Builder::Dec(
                Decimal128Builder::with_capacity(rows)
                    .with_precision_and_scale(precision, scale)
                    .unwrap_or_else(|_| Decimal128Builder::with_capacity(rows)),
            ),
        }
    }

    fn null(&mut self) {
        match self {
            Builder::Bool(b) => b.append_null(),
            Builder::I16(b) => b.append_null(),
            Builder::I32(b) => b.append_null(),
            Builder::I64(b) => b.append_null(),
            Builder::F32(b) => b.append_null(),
            Builder::F64(b) => b.append_null(),
            Builder::Str(b) => b.append_null(),
            Builder::Bin(b) => b.append_null(),
            Builder::Date(b) => b.append_null(),
            Builder::Ts(b) => b.append_null(),
            Builder::Dec(b) => b.append_null(),
        }
    }

    /// Appends one value in Postgres's binary send format.
    fn value(&mut self, kind: PgKind, v: &[u8]) -> Result<(), String> {
        let size = || format!("{} bytes is not a {kind:?} value", v.len());
        match self {
            Builder::Bool(b) => b.append_value(v.first().ok_or_else(size)? != &0),
            Builder::I16(b) => b.append_value(i16::from_be_bytes(be(v).ok_or_else(size)?)),
            Builder::I32(b) => b.append_value(i32::from_be_bytes(be(v).ok_or_else(size)?)),
            Builder::I64(b) => b.append_value(i64::from_be_bytes(be(v).ok_or_else(size)?)),
            Builder::F32(b) => b.append_value(f32::from_be_bytes(be(v).ok_or_else(size)?)),
            Builder::F64(b) => b.append_value(f64::from_be_bytes(be(v).ok_or_else(size)?)),
            Builder::Str(b) => match kind {
                PgKind::Uuid => {
                    let u = uuid::Uuid::from_bytes(be(v).ok_or_else(size)?);
                    b.append_value(
                        u.hyphenated()
                            .encode_lower(&mut uuid::Uuid::encode_buffer()),
                    )
                }
                // jsonb's send format is a version byte (1) and the text.
                PgKind::Jsonb => match v.split_first() {
                    Some((1, text)) => b.append_value(utf8(text)?),
                    _ => return Err("jsonb value with an unknown format version".into()),
                },
                _ => b.append_value(utf8(v)?),
            },
            Builder::Bin(b) => b.append_value(v),
            Builder::Date(b) => {
                let d = i32::from_be_bytes(be(v).ok_or_else(size)?);
                b.append_value(
                    d.checked_add(PG_EPOCH_DAYS)
                        .ok_or_else(|| "date out of range (infinity?)".to_string())?,
                )
            }
            Builder::Ts(b) => {
                let t = i64::from_be_bytes(be(v).ok_or_else(size)?);
                b.append_value(
                    t.checked_add(PG_EPOCH_US)
                        .ok_or_else(|| "timestamp out of range (infinity?)".to_string())?,
                )
            }
            Builder::Dec(b) => {
                let PgKind::Numeric { scale, .. } = kind else {
                    return Err("decimal builder for a non-numeric column".into());
                };
                b.append_value(numeric(v, scale)?)
            }
        }
        Ok(())
    }

    /// Appends one value in Postgres's text output form (as a logical
    /// replication stream sends it, with `DateStyle` ISO and `TimeZone`
    /// UTC): the same Arrow value the send format gives.
    fn text(&mut self, kind: PgKind, v: &str) -> Result<(), String> {
        let bad = || format!("'{v}' is not a {kind:?} value");
        match self {
            Builder::Bool(b) => b.append_value(match v {
                "t" => true,
                "f" => false,
                _ => return Err(bad()),
            }),
            Builder::I16(b) => b.append_value(v.parse().map_err(|_| bad())?),
            Builder::I32(b) => b.append_value(v.parse().map_err(|_| bad())?),
            Builder::I64(b) => b.append_value(v.parse().map_err(|_| bad())?),
            Builder::F32(b) => b.append_value(float(v).ok_or_else(bad)? as f32),
            Builder::F64(b) => b.append_value(float(v).ok_or_else(bad)?),
            Builder::Str(b) => b.append_value(v),
            Builder::Bin(b) => {
                let hex = v.strip_prefix("\\x").ok_or_else(bad)?;
                if hex.len() % 2 != 0 {
                    return Err(bad());
                }
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| bad())?;
                b.append_value(bytes)
            }
            Builder::Date(b) => {
                let d = chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d").map_err(|_| bad())?;
                let unix = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).ok_or_else(bad)?;
                let days = i32::try_from((d - unix).num_days()).map_err(|_| bad())?;
                b.append_value(days)
            }
            Builder::Ts(b) => {
                let micros = match kind {
                    PgKind::TimestampTz => {
                        chrono::DateTime::parse_from_str(v, "%Y-%m-%d %H:%M:%S%.f%#z")
                            .map_err(|_| bad())?
                            .timestamp_micros()
                    }
                    _ => chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%d %H:%M:%S%.f")
                        .map_err(|_| bad())?
                        .and_utc()
                        .timestamp_micros(),
                };
                b.append_value(micros)
            }
            Builder::Dec(b) => {
                let PgKind::Numeric { scale, .. } = kind else {
                    return Err("decimal builder for a non-numeric column".into());
                };
                b.append_value(decimal_text(v, scale).ok_or_else(bad)?)
            }
        }
        Ok(())
    }

    /// The values so far as an array; the builder starts again empty with
    /// room for as many rows and bytes (the next batch of a stream is
    /// about the size of the last: without it each batch would grow its
    /// buffers from nothing, copying them at every doubling).
    fn finish_and_reserve(&mut self, kind: PgKind) -> ArrayRef {
        let bytes = match self {
            Builder::Str(b) => b.values_slice().len(),
            Builder::Bin(b) => b.values_slice().len(),
            _ => 0,
        };
        let array = self.finish();
        if array.is_empty() {
            // Nothing was read (a change stream's quiet round): the builder
            // is as it was, and nothing is allocated for a batch that may
            // not come.
            return array;
        }
        let rows = array.len().max(1024);
        *self = Builder::with_capacity(kind, rows, bytes.max(rows * 16));
        array
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::Bool(b) => Arc::new(b.finish()),
            Builder::I16(b) => Arc::new(b.finish()),
            Builder::I32(b) => Arc::new(b.finish()),
            Builder::I64(b) => Arc::new(b.finish()),
            Builder::F32(b) => Arc::new(b.finish()),
            Builder::F64(b) => Arc::new(b.finish()),
            Builder::Str(b) => Arc::new(b.finish()),
            Builder::Bin(b) => Arc::new(b.finish()),
            Builder::Date(b) => Arc::new(b.finish()),
            Builder::Ts(b) => Arc::new(b.finish()),
            Builder::Dec(b) => Arc::new(b.finish()),
        }
    }
}

/// Each column's values so far as an array, its builder ready for a batch
/// of the same size.
fn finish_all(builders: &mut [Builder], columns: &[PgColumn]) -> Vec<ArrayRef> {
    builders
        .iter_mut()
        .zip(columns)
        .map(|(b, c)| b.finish_and_reserve(c.kind))
        .collect()
}

/// A float as Postgres prints it, `NaN` and the infinities included.
fn float(v: &str) -> Option<f64> {
    match v {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

/// A decimal as text (`-12.5`) as an integer at `scale` (`-1250` at 2);
/// None for `NaN`, a value with more decimals than the scale, or one too
/// large.
fn decimal_text(v: &str, scale: i8) -> Option<i128> {
    let (neg, digits) = match v.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let scale = usize::try_from(scale).ok()?;
    if int.is_empty() && frac.is_empty() || frac.len() > scale {
        return None;
    }
    let mut n: i128 = 0;
    for c in int
        .chars()
        .chain(frac.chars())
        .chain(std::iter::repeat_n('0', scale - frac.len()))
    {
        let d = c.to_digit(10)?;
        n = n.checked_mul(10)?.checked_add(i128::from(d))?;
    }
    Some(if neg { -n } else { n })
}

/// Rows given as text values (a change stream's tuples) into batches of
/// columns, typed as a binary COPY of the same columns would be.
pub struct TextRows {
    columns: Vec<PgColumn>,
    builders: Vec<Builder>,
    rows: usize,
}

impl TextRows {
    pub fn new(columns: Vec<PgColumn>) -> TextRows {
        let builders = columns.iter().map(|c| Builder::new(c.kind, 256)).collect();
        TextRows {
            columns,
            builders,
            rows: 0,
        }
    }

    /// Appends a row, one value (or null) per column.
    pub fn push(&mut self, values: &[Option<&str>]) -> Result<(), CopyError> {
        if values.len() != self.columns.len() {
            return Err(CopyError::FieldCount {
                got: i16::try_from(values.len()).unwrap_or(i16::MAX),
                want: self.columns.len(),
            });
        }
        for ((b, c), v) in self.builders.iter_mut().zip(&self.columns).zip(values) {
            match v {
                None => b.null(),
                Some(v) => b.text(c.kind, v).map_err(|reason| CopyError::Value {
                    column: c.name.clone(),
                    reason,
                })?,
            }
        }
        self.rows += 1;
        Ok(())
    }

    pub fn pending(&self) -> usize {
        self.rows
    }

    /// The pending rows as arrays; the next batch starts empty.
    pub fn take(&mut self) -> Vec<ArrayRef> {
        self.rows = 0;
        finish_all(&mut self.builders, &self.columns)
    }
}

fn utf8(v: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(v).map_err(|e| format!("not UTF-8: {e}"))
}

/// A numeric in send format (ndigits, weight, sign, dscale, base-10000
/// digits) as an integer at `scale`.
pub fn numeric(v: &[u8], scale: i8) -> Result<i128, String> {
    let word = |i: usize| -> Result<u16, String> {
        v.get(i * 2..i * 2 + 2)
            .and_then(be::<2>)
            .map(u16::from_be_bytes)
            .ok_or_else(|| "truncated numeric".to_string())
    };
    let ndigits = usize::from(word(0)?);
    let weight = i32::from(word(1)? as i16);
    let sign = word(2)?;
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Err("NaN does not fit a decimal".into()),
        _ => return Err("infinity does not fit a decimal".into()),
    }
    // n is in units of 10000^(weight - ndigits + 1); moved to 10^-scale.
    let exp = 4 * (weight - ndigits as i32 + 1) + i32::from(scale);
    // Most values have a few digit groups and a small shift: in 64 bits,
    // where division is one instruction and i128's is a library call.
    if ndigits <= 4 && (-18..=2).contains(&exp) {
        let mut n: u64 = 0;
        for i in 0..ndigits {
            n = n * 10_000 + u64::from(word(4 + i)?);
        }
        if exp >= 0 {
            n *= 10u64.pow(exp as u32);
        } else {
            let div = 10u64.pow((-exp) as u32);
            if !n.is_multiple_of(div) {
                return Err(format!("more than {scale} decimal places"));
            }
            n /= div;
        }
        let n = i128::from(n);
        return Ok(if sign == 0x4000 { -n } else { n });
    }
    let overflow = || "numeric does not fit 38 digits".to_string();
    let mut n: i128 = 0;
    for i in 0..ndigits {
        let d = i128::from(word(4 + i)?);
        n = n
            .checked_mul(10_000)
            .and_then(|n| n.checked_add(d))
            .ok_or_else(overflow)?;
    }
    if exp >= 0 {
        n = n
            .checked_mul(10i128.checked_pow(exp as u32).ok_or_else(overflow)?)
            .ok_or_else(overflow)?;
    } else {
        let div = 10i128.checked_pow((-exp) as u32).ok_or_else(overflow)?;
        if n % div != 0 {
            return Err(format!("more than {scale} decimal places"));
        }
        n /= div;
    }
    Ok(if sign == 0x4000 { -n } else { n })
}

/// FNV-1a over bytes, from a running state.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `_orca_id` from a row's key fields as they arrive: a 128-bit hash (two
/// FNV-1a lanes) of the stream name and the key columns' binary values in
/// column order, so a record read again gets the same id without its values
/// ever being formatted.
struct RowIds {
    seeds: (u64, u64),
    is_key: Vec<bool>,
    cur: (u64, u64),
    builder: FixedSizeBinaryBuilder,
}

impl RowIds {
    fn start(&mut self) {
        self.cur = self.seeds;
    }

    fn field(&mut self, v: Option<&[u8]>) {
        // The length first, so that ("ab", "c") and ("a", "bc") differ.
        let len = v.map_or(-1i32, |v| v.len() as i32).to_be_bytes();
        self.cur.0 = fnv(fnv(self.cur.0, &len), v.unwrap_or_default());
        self.cur.1 = fnv(fnv(self.cur.1, &len), v.unwrap_or_default());
    }

    fn finish_row(&mut self) {
        // 16 bytes: the stream's form decides later whether they become
        // hex (crate::ids::conform); most streams keep them as they are.
        let id = crate::ids::bytes(self.cur.0, self.cur.1);
        // The builder's width is the id's: appending cannot fail.
        let _ = self.builder.append_value(id);
    }
}

/// The bytes of the row that starts `held` (2 for the end of the stream),
/// if `held` holds all of it and its field count is `fields`.
fn row_in(held: &[u8], fields: usize) -> Option<usize> {
    let count = i16::from_be_bytes([*held.first()?, *held.get(1)?]);
    if count == -1 {
        return Some(2);
    }
    if count < 0 || count as usize != fields {
        // The slow path says what is wrong with it.
        return None;
    }
    let mut at = 2usize;
    for _ in 0..fields {
        let l = held.get(at..at + 4)?;
        let len = i32::from_be_bytes([l[0], l[1], l[2], l[3]]);
        at += 4;
        if len > 0 {
            at = at.checked_add(len as usize)?;
            if at > held.len() {
                return None;
            }
        }
    }
    Some(at)
}

/// One field of a row (None: NULL) into its column's builder, and into
/// the row's `_orca_id` when it is a key column.
fn put_field(
    b: &mut Builder,
    column: &PgColumn,
    key: Option<&mut RowIds>,
    v: Option<&[u8]>,
) -> Result<(), CopyError> {
    if let Some(ids) = key {
        ids.field(v);
    }
    match v {
        None => b.null(),
        Some(v) => b.value(column.kind, v).map_err(|reason| CopyError::Value {
            column: column.name.clone(),
            reason,
        })?,
    }
    Ok(())
}

/// Reads rows of a binary COPY stream into batches of columns.
pub struct CopyReader<R> {
    input: R,
    columns: Vec<PgColumn>,
    builders: Vec<Builder>,
    rows: usize,
    buf: Vec<u8>,
    done: bool,
    ids: Option<RowIds>,
    /// Bytes read so far, for throughput figures.
    pub bytes: u64,
}

impl<R: BufRead> CopyReader<R> {
    /// Checks the stream's header.
    pub fn new(mut input: R, columns: Vec<PgColumn>) -> Result<Self, CopyError> {
        let mut head = [0u8; 19];
        input.read_exact(&mut head)?;
        if &head[..11] != SIGNATURE {
            return Err(CopyError::Signature);
        }
        let ext = u32::from_be_bytes([head[15], head[16], head[17], head[18]]);
        io::copy(&mut (&mut input).take(u64::from(ext)), &mut io::sink())?;
        let builders = columns.iter().map(|c| Builder::new(c.kind, 1024)).collect();
        Ok(CopyReader {
            input,
            columns,
            builders,
            rows: 0,
            buf: Vec::new(),
            done: false,
            ids: None,
            bytes: 19 + u64::from(ext),
        })
    }

    /// Also computes each row's `_orca_id` from the stream's name and the
    /// values of these columns (the source's key).
    pub fn with_ids(mut self, stream: &str, key: &[usize]) -> Self {
        let mut is_key = vec![false; self.columns.len()];
        for &k in key {
            if let Some(x) = is_key.get_mut(k) {
                *x = true;
            }
        }
        let name = stream.as_bytes();
        self.ids = Some(RowIds {
            seeds: (
                fnv(fnv(0xcbf2_9ce4_8422_2325, name), &[0]),
                fnv(fnv(0x6c62_272e_07bb_0142, name), &[0]),
            ),
            is_key,
            cur: (0, 0),
            builder: FixedSizeBinaryBuilder::new(crate::ids::ID_BYTES),
        });
        self
    }

    /// The pending rows' `_orca_id`s (after [`Self::with_ids`]); call before
    /// [`Self::take`].
    pub fn take_ids(&mut self) -> Option<ArrayRef> {
        self.ids.as_mut().map(|ids| {
            let done = ids.builder.finish();
            // Room for the next batch's ids, as for the columns in `take`.
            let rows = arrow_array::Array::len(&done);
            if rows > 0 {
                ids.builder =
                    FixedSizeBinaryBuilder::with_capacity(rows.max(1024), crate::ids::ID_BYTES);
            }
            Arc::new(done) as ArrayRef
        })
    }

    /// Rows read into the pending batch.
    pub fn pending(&self) -> usize {
        self.rows
    }

    /// Reads one row into the pending batch; false at the end of the stream.
    pub fn read_row(&mut self) -> Result<bool, CopyError> {
        if self.done {
            return Ok(false);
        }
        // Postgres sends a row per CopyData message, which the reader holds
        // whole: decode it where it lies, without copying each field out.
        let Self {
            input,
            columns,
            builders,
            ids,
            ..
        } = self;
        let held = input.fill_buf()?;
        if let Some(used) = row_in(held, columns.len()) {
            if used == 2 {
                input.consume(2);
                self.bytes += 2;
                return self.trailer();
            }
            if let Some(ids) = ids.as_mut() {
                ids.start();
            }
            let mut at = 2;
            for (i, b) in builders.iter_mut().enumerate() {
                let len = i32::from_be_bytes([held[at], held[at + 1], held[at + 2], held[at + 3]]);
                at += 4;
                let v = (len >= 0).then(|| &held[at..at + len as usize]);
                at += v.map_or(0, <[u8]>::len);
                put_field(b, &columns[i], ids.as_mut().filter(|ids| ids.is_key[i]), v)?;
            }
            if let Some(ids) = ids.as_mut() {
                ids.finish_row();
            }
            input.consume(used);
            self.bytes += used as u64;
            self.rows += 1;
            return Ok(true);
        }
        self.read_row_across()
    }

    /// The stream's trailer was read: the input is read to its end, so a
    /// connection's COPY is seen finished (and the connection can close
    /// with a goodbye instead of as a COPY left half read).
    fn trailer(&mut self) -> Result<bool, CopyError> {
        self.done = true;
        self.input.fill_buf()?;
        Ok(false)
    }

    /// [`Self::read_row`] for a row the reader does not hold whole: field
    /// by field, each copied out.
    fn read_row_across(&mut self) -> Result<bool, CopyError> {
        let mut w = [0u8; 2];
        self.input.read_exact(&mut w)?;
        let count = i16::from_be_bytes(w);
        self.bytes += 2;
        if count == -1 {
            return self.trailer();
        }
        if count as usize != self.columns.len() || count < 0 {
            return Err(CopyError::FieldCount {
                got: count,
                want: self.columns.len(),
            });
        }
        if let Some(ids) = &mut self.ids {
            ids.start();
        }
        for (i, b) in self.builders.iter_mut().enumerate() {
            let mut l = [0u8; 4];
            self.input.read_exact(&mut l)?;
            let len = i32::from_be_bytes(l);
            self.bytes += 4;
            let key = self.ids.as_mut().filter(|ids| ids.is_key[i]);
            if len < 0 {
                put_field(b, &self.columns[i], key, None)?;
                continue;
            }
            self.buf.resize(len as usize, 0);
            self.input.read_exact(&mut self.buf)?;
            self.bytes += len as u64;
            put_field(b, &self.columns[i], key, Some(&self.buf))?;
        }
        if let Some(ids) = &mut self.ids {
            ids.finish_row();
        }
        self.rows += 1;
        Ok(true)
    }

    /// The pending rows as arrays, one per column; the next batch starts empty.
    pub fn take(&mut self) -> Vec<ArrayRef> {
        self.rows = 0;
        finish_all(&mut self.builders, &self.columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Decimal128Array, Int64Array, StringArray, TimestampMicrosecondArray};

    fn stream(rows: &[Vec<Option<Vec<u8>>>]) -> Vec<u8> {
        let mut s = SIGNATURE.to_vec();
        s.extend(0u32.to_be_bytes());
        s.extend(0u32.to_be_bytes());
        for r in rows {
            s.extend((r.len() as i16).to_be_bytes());
            for f in r {
                match f {
                    None => s.extend((-1i32).to_be_bytes()),
                    Some(v) => {
                        s.extend((v.len() as i32).to_be_bytes());
                        s.extend(v);
                    }
                }
            }
        }
        s.extend((-1i16).to_be_bytes());
        s
    }

    fn numeric_bytes(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend((digits.len() as u16).to_be_bytes());
        v.extend(weight.to_be_bytes());
        v.extend(sign.to_be_bytes());
        v.extend(dscale.to_be_bytes());
        for d in digits {
            v.extend(d.to_be_bytes());
        }
        v
    }

    #[test]
    fn numerics_land_at_the_column_scale() {
        // 12345.67 = [1, 2345, 6700] with weight 1.
        let v = numeric_bytes(1, 0, 2, &[1, 2345, 6700]);
        assert_eq!(numeric(&v, 2), Ok(1_234_567));
        assert_eq!(numeric(&v, 4), Ok(123_456_700));
        assert!(numeric(&v, 1).is_err(), "67 cents do not fit one place");
        // -0.05 = [500] with weight -1.
        assert_eq!(numeric(&numeric_bytes(-1, 0x4000, 2, &[500]), 2), Ok(-5));
        // 20000 = [2] with weight 1.
        assert_eq!(numeric(&numeric_bytes(1, 0, 0, &[2]), 0), Ok(20_000));
        assert_eq!(numeric(&numeric_bytes(0, 0, 0, &[]), 3), Ok(0));
        assert!(numeric(&numeric_bytes(0, 0xC000, 0, &[]), 2).is_err());
        // Past the 64-bit path: 16 digit groups, and a big shift.
        let big = numeric_bytes(8, 0, 0, &[9999; 9]);
        assert_eq!(numeric(&big, 0), Ok(10i128.pow(36) - 1));
        assert_eq!(
            numeric(&numeric_bytes(4, 0, 0, &[1]), 10),
            Ok(10i128.pow(26))
        );
        assert!(
            numeric(&numeric_bytes(10, 0, 0, &[1]), 2).is_err(),
            "past 128 bits"
        );
    }

    #[test]
    fn the_64_bit_path_and_the_128_bit_path_agree() {
        // Every split of a value into groups and shifts either path takes.
        for digits in [
            &[][..],
            &[7],
            &[1, 2345],
            &[9999, 9999, 9999, 9999],
            &[12, 0, 3],
        ] {
            for weight in -6i16..6 {
                for scale in 0i8..12 {
                    for sign in [0u16, 0x4000] {
                        let v = numeric_bytes(weight, sign, 0, digits);
                        let got = numeric(&v, scale);
                        // The value by hand: digits in base 10000, shifted.
                        let mut want: Option<i128> = Some(0);
                        for d in digits {
                            want = want
                                .and_then(|n| n.checked_mul(10_000))
                                .map(|n| n + i128::from(*d));
                        }
                        let exp =
                            4 * (i32::from(weight) - digits.len() as i32 + 1) + i32::from(scale);
                        let want = want.and_then(|n| {
                            if exp >= 0 {
                                n.checked_mul(10i128.checked_pow(exp as u32)?)
                            } else {
                                let div = 10i128.checked_pow((-exp) as u32)?;
                                (n % div == 0).then_some(n / div)
                            }
                        });
                        let want = want.map(|n| if sign == 0x4000 { -n } else { n });
                        assert_eq!(got.ok(), want, "{digits:?} weight {weight} scale {scale}");
                    }
                }
            }
        }
    }

    #[test]
    fn rows_become_typed_arrays_with_nulls() {
        let cols = vec![
            PgColumn {
                name: "id".into(),
                kind: PgKind::Int8,
                nullable: false,
            },
            PgColumn {
                name: "name".into(),
                kind: PgKind::Text,
                nullable: true,
            },
            PgColumn {
                name: "at".into(),
                kind: PgKind::TimestampTz,
                nullable: true,
            },
            PgColumn {
                name: "price".into(),
                kind: PgKind::of(1700, ((10 << 16) | 2) + 4).expect("numeric(10,2)"),
                nullable: true,
            },
        ];
        let bytes = stream(&[
            vec![
                Some(7i64.to_be_bytes().to_vec()),
                Some(b"seven".to_vec()),
                Some(0i64.to_be_bytes().to_vec()),
                Some(numeric_bytes(0, 0, 2, &[9, 9900])),
            ],
            vec![Some(8i64.to_be_bytes().to_vec()), None, None, None],
        ]);
        let mut r = CopyReader::new(&bytes[..], cols).expect("header");
        assert!(r.read_row().expect("row 1"));
        assert!(r.read_row().expect("row 2"));
        assert!(!r.read_row().expect("end"));
        assert_eq!(r.bytes as usize, bytes.len());
        let arrays = r.take();
        let ids = arrays[0]
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("i64");
        assert_eq!(ids.values(), &[7, 8]);
        let names = arrays[1]
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("str");
        assert_eq!(names.value(0), "seven");
        assert!(names.is_null(1));
        let at = arrays[2]
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .expect("ts");
        assert_eq!(at.value(0), PG_EPOCH_US, "2000-01-01 in Unix microseconds");
        let price = arrays[3]
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .expect("decimal");
        assert_eq!(price.value(0), 999, "9.99 at scale 2");
        assert_eq!(price.data_type(), &DataType::Decimal128(10, 2));
    }

    #[test]
    fn a_row_the_reader_holds_in_parts_decodes_as_a_whole_one() {
        // The first two columns of the test above.
        let cols: Vec<PgColumn> = [("id", PgKind::Int8, false), ("name", PgKind::Text, true)]
            .into_iter()
            .map(|(name, kind, nullable)| PgColumn {
                name: name.into(),
                kind,
                nullable,
            })
            .collect();
        let rows: Vec<Vec<Option<Vec<u8>>>> = (0..50i64)
            .map(|i| {
                vec![
                    Some(i.to_be_bytes().to_vec()),
                    (i % 3 != 0).then(|| format!("name {i}").into_bytes()),
                ]
            })
            .collect();
        let bytes = stream(&rows);
        fn decode<R: BufRead>(r: CopyReader<R>) -> (Vec<ArrayRef>, ArrayRef, u64) {
            let mut r = r.with_ids("s", &[0]);
            while r.read_row().expect("row") {}
            let ids = r.take_ids().expect("ids");
            (r.take(), ids, r.bytes)
        }
        // Whole rows in one buffer (as Postgres sends them), then a buffer
        // of 7 bytes that never holds a whole row.
        let whole = decode(CopyReader::new(&bytes[..], cols.clone()).expect("header"));
        let small = std::io::BufReader::with_capacity(7, &bytes[..]);
        let parts = decode(CopyReader::new(small, cols).expect("header"));
        assert_eq!(whole.0.len(), 2);
        for (a, b) in whole.0.iter().zip(&parts.0) {
            assert_eq!(a.to_data(), b.to_data());
        }
        assert_eq!(whole.1.to_data(), parts.1.to_data());
        assert_eq!(whole.0[0].len(), 50);
        assert_eq!((whole.2, parts.2), (bytes.len() as u64, bytes.len() as u64));
    }

    #[test]
    fn ids_depend_on_the_stream_and_key_values_only() {
        let cols = vec![
            PgColumn {
                name: "id".into(),
                kind: PgKind::Int8,
                nullable: false,
            },
            PgColumn {
                name: "note".into(),
                kind: PgKind::Text,
                nullable: true,
            },
        ];
        let row = |id: i64, note: &[u8]| vec![Some(id.to_be_bytes().to_vec()), Some(note.to_vec())];
        let bytes = stream(&[row(1, b"a"), row(1, b"b"), row(2, b"a")]);
        let ids_of = |name: &str| {
            let mut r = CopyReader::new(&bytes[..], cols.clone())
                .expect("header")
                .with_ids(name, &[0]);
            while r.read_row().expect("row") {}
            let ids = r.take_ids().expect("ids");
            assert_eq!(ids.data_type(), &crate::ids::IdForm::Bytes.data_type());
            (0..ids.len())
                .map(|i| crate::ids::text_at(ids.as_ref(), i))
                .collect::<Vec<_>>()
        };
        let a = ids_of("orders");
        assert_eq!(
            a[0], a[1],
            "same key, same id, whatever the other columns hold"
        );
        assert_ne!(a[0], a[2]);
        assert_eq!(a[0].len(), 32);
        assert_eq!(a, ids_of("orders"), "stable across reads");
        assert_ne!(a[0], ids_of("users")[0], "the stream is part of the id");
    }

    #[test]
    fn a_wrong_field_count_or_bad_header_is_an_error() {
        let cols = vec![PgColumn {
            name: "id".into(),
            kind: PgKind::Int4,
            nullable: false,
        }];
        assert!(matches!(
            CopyReader::new(&b"PGCOPY\n\xff\r\n\x01........"[..], cols.clone()),
            Err(CopyError::Signature)
        ));
        let bytes = stream(&[vec![None, None]]);
        let mut r = CopyReader::new(&bytes[..], cols.clone()).expect("header");
        assert!(matches!(
            r.read_row(),
            Err(CopyError::FieldCount { got: 2, want: 1 })
        ));
        let bytes = stream(&[vec![Some(vec![1, 2])]]);
        let mut r = CopyReader::new(&bytes[..], cols).expect("header");
        let e = r.read_row().expect_err("2 bytes are not an int4");
        assert!(e.to_string().contains("column id"), "{e}");
    }

    #[test]
    fn text_values_become_the_same_arrays_as_the_send_format() {
        let cols = |kind| {
            vec![PgColumn {
                name: "c".into(),
                kind,
                nullable: true,
            }]
        };
        let one = |kind, v: &str| {
            let mut t = TextRows::new(cols(kind));
            t.push(&[Some(v)]).map(|_| t.take().remove(0))
        };
        let ts = one(PgKind::TimestampTz, "2024-03-05 06:07:08.123456+00").expect("ts");
        let ts = ts
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .expect("ts array");
        assert_eq!(ts.value(0), 1_709_618_828_123_456);
        let ts = one(PgKind::TimestampTz, "2024-03-05 08:07:08+02").expect("ts");
        let ts = ts
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .expect("ts array");
        assert_eq!(ts.value(0), 1_709_618_828_000_000);
        let plain = one(PgKind::Timestamp, "2024-03-05 06:07:08").expect("ts");
        let plain = plain
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .expect("ts array");
        assert_eq!(plain.value(0), 1_709_618_828_000_000);
        let dec = one(
            PgKind::Numeric {
                precision: 12,
                scale: 2,
            },
            "-12.5",
        )
        .expect("numeric");
        let dec = dec
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .expect("decimal array");
        assert_eq!(dec.value(0), -1250);
        assert_eq!(decimal_text("7", 3), Some(7000));
        assert_eq!(
            decimal_text("0.125", 2),
            None,
            "more decimals than the scale"
        );
        assert_eq!(decimal_text("NaN", 2), None);
        let b = one(PgKind::Bytea, "\\x00ff10").expect("bytea");
        let b = b
            .as_any()
            .downcast_ref::<arrow_array::BinaryArray>()
            .expect("binary");
        assert_eq!(b.value(0), [0u8, 255, 16]);
        let d = one(PgKind::Date, "1970-01-03").expect("date");
        let d = d
            .as_any()
            .downcast_ref::<arrow_array::Date32Array>()
            .expect("date array");
        assert_eq!(d.value(0), 2);
        let f = one(PgKind::Float8, "-Infinity").expect("float");
        let f = f
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .expect("float array");
        assert_eq!(f.value(0), f64::NEG_INFINITY);
        let e = one(PgKind::Int4, "12x").expect_err("not an int");
        assert!(e.to_string().contains("'12x' is not a Int4 value"), "{e}");
        let mut t = TextRows::new(cols(PgKind::Bool));
        t.push(&[None]).expect("null");
        t.push(&[Some("t")]).expect("true");
        let a = t.take().remove(0);
        assert_eq!((a.len(), a.null_count()), (2, 1));
        assert!(t.push(&[None, None]).is_err(), "two values for one column");
    }
}
