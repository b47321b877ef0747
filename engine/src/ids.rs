//! `_orca_id`, a row's 128-bit identity, in the two forms a destination can
//! hold it: 16 bytes (Arrow `FixedSizeBinary(16)`, Parquet and Iceberg
//! `fixed[16]`, Postgres `uuid`), what a stream gets when it starts, or 32 lowercase hex
//! characters, what a stream started before 0.3 keeps. Both are the same
//! two 64-bit lanes, so one row has the same identity in either form (the
//! hex is the bytes' hex; Postgres casts it to the same `uuid`).
//!
//! A stream's form is what its checkpoint state recorded (the stream's
//! schema as last staged): a destination that holds hex ids keeps getting
//! them, so its `UNIQUE (_orca_id)`, its skip-by-id and its readers see one
//! form.

use std::sync::Arc;

use arrow_array::builder::{FixedSizeBinaryBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

/// The column's name.
pub const ORCA_ID: &str = "_orca_id";
/// Bytes in an id.
pub const ID_BYTES: i32 = 16;

/// How a stream's `_orca_id` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdForm {
    /// 16 bytes: a new stream's form.
    #[default]
    Bytes,
    /// 32 hex characters: the form of a stream whose recorded schema says
    /// `Utf8` (it began before ids were bytes).
    Hex,
}

impl IdForm {
    /// The form a stream's recorded schema (name, Arrow type as text) says;
    /// a stream with none recorded yet starts with bytes.
    pub fn of_recorded(recorded: &[(String, String)]) -> IdForm {
        match recorded.iter().find(|(n, _)| n == ORCA_ID) {
            Some((_, t)) if t == "Utf8" => IdForm::Hex,
            _ => IdForm::Bytes,
        }
    }

    pub fn data_type(self) -> DataType {
        match self {
            IdForm::Bytes => DataType::FixedSizeBinary(ID_BYTES),
            IdForm::Hex => DataType::Utf8,
        }
    }

    /// The column. Bytes go without Arrow's UUID extension: the Parquet
    /// writer turns it into the UUID logical type only with a feature
    /// that would also tag every UUID and JSON column DataFusion reads.
    pub fn field(self) -> Field {
        Field::new(ORCA_ID, self.data_type(), false)
    }
}

/// An id's two lanes as its 16 bytes, big-endian: the bytes whose hex is
/// [`hex`].
pub fn bytes(a: u64, b: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_be_bytes());
    out[8..].copy_from_slice(&b.to_be_bytes());
    out
}

/// Two lanes of an id as 32 lowercase hex digits, as `{:016x}{:016x}`.
pub fn hex(a: u64, b: u64) -> [u8; 32] {
    hex_of(&bytes(a, b))
}

/// The same, as a string.
pub fn text(a: u64, b: u64) -> String {
    String::from_utf8_lossy(&hex(a, b)).into_owned()
}

fn hex_of(id: &[u8; 16]) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in id.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    out
}

fn bytes_of_hex(s: &str) -> Option<[u8; 16]> {
    let s = s.as_bytes();
    if s.len() != 32 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (digit(s[2 * i])? << 4) | digit(s[2 * i + 1])?;
    }
    Some(out)
}

#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("_orca_id {value:?} is not 32 hex digits, so it has no 16-byte form")]
    NotHex { value: String },
    #[error("_orca_id of type {got} cannot become {want}")]
    Type { got: DataType, want: DataType },
    #[error("a batch with its _orca_id in another form: {0}")]
    Batch(String),
}

/// `ids` in the form `want` names (a no-op when it is that already): a
/// source that makes one form feeds a stream recorded with the other.
pub fn conform(ids: ArrayRef, want: &DataType) -> Result<ArrayRef, IdError> {
    if ids.data_type() == want {
        return Ok(ids);
    }
    match (ids.data_type(), want) {
        (DataType::Utf8, DataType::FixedSizeBinary(ID_BYTES)) => {
            let text = ids.as_string::<i32>();
            let mut out = FixedSizeBinaryBuilder::with_capacity(text.len(), ID_BYTES);
            for v in text.iter() {
                match v {
                    None => out.append_null(),
                    Some(v) => {
                        let b = bytes_of_hex(v).ok_or_else(|| IdError::NotHex {
                            value: v.to_string(),
                        })?;
                        out.append_value(b).map_err(|_| IdError::NotHex {
                            value: v.to_string(),
                        })?;
                    }
                }
            }
            Ok(Arc::new(out.finish()))
        }
        (DataType::FixedSizeBinary(ID_BYTES), DataType::Utf8) => {
            let raw = ids.as_fixed_size_binary();
            let mut out = StringBuilder::with_capacity(raw.len(), raw.len() * 32);
            for v in raw.iter() {
                match v.and_then(|v| <&[u8; 16]>::try_from(v).ok()) {
                    None => out.append_null(),
                    Some(v) => out.append_value(std::str::from_utf8(&hex_of(v)).unwrap_or("")),
                }
            }
            Ok(Arc::new(out.finish()))
        }
        (got, want) => Err(IdError::Type {
            got: got.clone(),
            want: want.clone(),
        }),
    }
}

/// `batch` with its `_orca_id` (if any) in `form`.
pub fn in_form(batch: &RecordBatch, form: IdForm) -> Result<RecordBatch, IdError> {
    let schema = batch.schema();
    let Ok(i) = schema.index_of(ORCA_ID) else {
        return Ok(batch.clone());
    };
    if schema.field(i).data_type() == &form.data_type() {
        return Ok(batch.clone());
    }
    let mut columns = batch.columns().to_vec();
    columns[i] = conform(columns[i].clone(), &form.data_type())?;
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields[i] = form.field();
    let schema = Schema::new_with_metadata(fields, schema.metadata().clone());
    RecordBatch::try_new(Arc::new(schema), columns).map_err(|e| IdError::Batch(e.to_string()))
}

/// Row `row`'s id as 32 hex digits whatever its form (what a held cell
/// names its row by; Postgres reads it as text or as `uuid`). Empty for a
/// null or a column of neither form.
pub fn text_at(ids: &dyn Array, row: usize) -> String {
    if ids.is_null(row) {
        return String::new();
    }
    match ids.data_type() {
        DataType::Utf8 => ids.as_string::<i32>().value(row).to_string(),
        DataType::FixedSizeBinary(ID_BYTES) => {
            <&[u8; 16]>::try_from(ids.as_fixed_size_binary().value(row))
                .map(|b| String::from_utf8_lossy(&hex_of(b)).into_owned())
                .unwrap_or_default()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{FixedSizeBinaryArray, StringArray};

    use super::*;

    #[test]
    fn the_hex_is_the_two_lanes_and_the_bytes_are_the_same_id() {
        for (a, b) in [
            (0, 0),
            (1, u64::MAX),
            (0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210),
        ] {
            let hex = hex(a, b);
            let text = std::str::from_utf8(&hex).expect("ascii");
            assert_eq!(text, format!("{a:016x}{b:016x}"));
            assert_eq!(bytes_of_hex(text), Some(bytes(a, b)));
        }
    }

    #[test]
    fn ids_go_from_one_form_to_the_other_and_back() {
        let hex: ArrayRef = Arc::new(StringArray::from(vec![
            Some(text(1, 2)),
            None,
            Some(text(u64::MAX, 7)),
        ]));
        let raw = conform(hex.clone(), &IdForm::Bytes.data_type()).expect("to bytes");
        let fixed = raw
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
            .expect("fixed");
        assert_eq!(fixed.value(0), bytes(1, 2));
        assert!(fixed.is_null(1));
        assert_eq!(text_at(raw.as_ref(), 2), text(u64::MAX, 7));
        let back = conform(raw, &IdForm::Hex.data_type()).expect("to hex");
        assert_eq!(back.as_ref(), hex.as_ref());
        // Already in form: the same array.
        let same = conform(hex.clone(), &DataType::Utf8).expect("same");
        assert!(Arc::ptr_eq(&same, &hex));
    }

    #[test]
    fn a_connector_gets_hex_ids_and_the_other_columns_as_they_were() {
        let raw = FixedSizeBinaryArray::try_from_iter([bytes(5, 6)].into_iter()).expect("ids");
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            IdForm::Bytes.field(),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(arrow_array::Int64Array::from(vec![9])),
                Arc::new(raw),
            ],
        )
        .expect("batch");
        let hex = in_form(&batch, IdForm::Hex).expect("hex");
        assert_eq!(hex.schema().field(1).data_type(), &DataType::Utf8);
        assert_eq!(hex.column(1).as_string::<i32>().value(0), text(5, 6));
        assert_eq!(hex.column(0).as_ref(), batch.column(0).as_ref());
    }

    #[test]
    fn text_that_is_no_id_is_refused_by_value() {
        let bad: ArrayRef = Arc::new(StringArray::from(vec!["o1"]));
        let e = conform(bad, &IdForm::Bytes.data_type())
            .expect_err("not hex")
            .to_string();
        assert!(e.contains("\"o1\"") && e.contains("32 hex digits"), "{e}");
        let ints: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![1]));
        assert!(conform(ints, &DataType::Utf8).is_err());
    }

    #[test]
    fn a_stream_keeps_the_form_its_state_recorded() {
        let rec = |t: &str| {
            vec![
                ("id".to_string(), "Int64".to_string()),
                (ORCA_ID.to_string(), t.to_string()),
            ]
        };
        assert_eq!(IdForm::of_recorded(&rec("Utf8")), IdForm::Hex);
        assert_eq!(
            IdForm::of_recorded(&rec("FixedSizeBinary(16)")),
            IdForm::Bytes
        );
        assert_eq!(IdForm::of_recorded(&[]), IdForm::Bytes);
        assert_eq!(
            IdForm::Bytes.data_type().to_string(),
            "FixedSizeBinary(16)",
            "what a staged stream records"
        );
    }
}
