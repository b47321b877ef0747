//! Routing rows to writer lanes by key group, with barriers in band.
//!
//! Every row of one key (the stream's primary key, or `_orca_id` when it has
//! none) goes to the same lane, so that a lane sees a key's changes in order;
//! a barrier goes to every lane after the rows that came before it, so that
//! each lane knows when all its rows of an epoch have arrived.

use arrow_array::{RecordBatch, UInt32Array};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::ArrowError;

/// What a lane receives, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum LaneInput {
    Rows(RecordBatch),
    Barrier { epoch: u64 },
}

/// Splits a stream's batches over `lanes` lanes by the hash of its key columns.
#[derive(Debug, Clone)]
pub struct Router {
    lanes: usize,
    key: Vec<String>,
}

/// FNV-1a over a row's key values, separated so that ("ab", "c") and
/// ("a", "bc") differ.
fn hash(parts: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl Router {
    /// The same key over another number of lanes (a sync scaled between
    /// epochs).
    pub fn with_lanes(&self, lanes: usize) -> Router {
        Router::new(lanes, self.key.clone())
    }

    /// `key`: the columns that group rows; empty means `_orca_id`.
    pub fn new(lanes: usize, key: Vec<String>) -> Self {
        let key = if key.is_empty() {
            vec!["_orca_id".to_string()]
        } else {
            key
        };
        Router {
            lanes: lanes.max(1),
            key,
        }
    }

    /// The lane each row of the batch goes to.
    pub fn lanes_of(&self, batch: &RecordBatch) -> Result<Vec<usize>, ArrowError> {
        let opts = FormatOptions::default().with_null("\u{0}null");
        let cols = self
            .key
            .iter()
            .map(|k| {
                batch.column_by_name(k).ok_or_else(|| {
                    ArrowError::SchemaError(format!("the batch has no key column {k}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let formatters = cols
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let lanes = self.lanes as u64;
        Ok((0..batch.num_rows())
            .map(|row| {
                let parts: Vec<String> = formatters
                    .iter()
                    .map(|f| f.value(row).to_string())
                    .collect();
                (hash(&parts) % lanes) as usize
            })
            .collect())
    }

    /// Splits a batch: one batch per lane that gets rows, rows in their order.
    pub fn route(&self, batch: &RecordBatch) -> Result<Vec<(usize, LaneInput)>, ArrowError> {
        let lanes = self.lanes_of(batch)?;
        let mut out = Vec::new();
        for lane in 0..self.lanes {
            let idx: Vec<u32> = lanes
                .iter()
                .enumerate()
                .filter(|(_, l)| **l == lane)
                .filter_map(|(i, _)| u32::try_from(i).ok())
                .collect();
            if idx.is_empty() {
                continue;
            }
            let indices = UInt32Array::from(idx);
            let columns = batch
                .columns()
                .iter()
                .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
                .collect::<Result<Vec<_>, _>>()?;
            out.push((
                lane,
                LaneInput::Rows(RecordBatch::try_new(batch.schema(), columns)?),
            ));
        }
        Ok(out)
    }

    /// A barrier, for every lane.
    pub fn barrier(&self, epoch: u64) -> Vec<(usize, LaneInput)> {
        (0..self.lanes)
            .map(|lane| (lane, LaneInput::Barrier { epoch }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn batch(ids: &[i64], versions: &[i64]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("version", DataType::Int64, false),
                Field::new("_orca_id", DataType::Utf8, false),
            ])),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(Int64Array::from(versions.to_vec())),
                Arc::new(StringArray::from(
                    ids.iter()
                        .zip(versions)
                        .map(|(i, v)| format!("{i}-{v}"))
                        .collect::<Vec<_>>(),
                )),
            ],
        )
        .expect("batch")
    }

    #[test]
    fn a_key_always_goes_to_the_same_lane_in_order() {
        let r = Router::new(3, vec!["id".into()]);
        let ids: Vec<i64> = (0..200).map(|i| i % 17).collect();
        let versions: Vec<i64> = (0..200).collect();
        let mut lane_of_key: BTreeMap<i64, usize> = BTreeMap::new();
        let mut last_version: BTreeMap<i64, i64> = BTreeMap::new();
        let mut total = 0;
        for (lane, input) in r.route(&batch(&ids, &versions)).expect("route") {
            let LaneInput::Rows(b) = input else {
                panic!("rows expected")
            };
            total += b.num_rows();
            let (id, v) = (
                b.column(0).as_primitive::<Int64Type>(),
                b.column(1).as_primitive::<Int64Type>(),
            );
            for i in 0..b.num_rows() {
                assert_eq!(*lane_of_key.entry(id.value(i)).or_insert(lane), lane);
                let prev = last_version.insert(id.value(i), v.value(i));
                assert!(
                    prev.is_none_or(|p| p < v.value(i)),
                    "a key's rows stay in order"
                );
            }
        }
        assert_eq!(total, 200);
        // Several lanes are used, and the same keys route the same way again.
        let used: std::collections::BTreeSet<usize> = lane_of_key.values().copied().collect();
        assert!(used.len() > 1);
        assert_eq!(
            r.lanes_of(&batch(&[5], &[0])).expect("lanes"),
            vec![lane_of_key[&5]]
        );
    }

    #[test]
    fn without_a_key_rows_group_by_their_id_and_barriers_reach_every_lane() {
        let r = Router::new(2, vec![]);
        let a = r.lanes_of(&batch(&[1, 2, 3], &[0, 0, 0])).expect("a");
        let b = r.lanes_of(&batch(&[1, 2, 3], &[0, 0, 0])).expect("b");
        assert_eq!(a, b);
        assert_eq!(
            r.barrier(4),
            vec![
                (0, LaneInput::Barrier { epoch: 4 }),
                (1, LaneInput::Barrier { epoch: 4 })
            ]
        );
        let missing = Router::new(2, vec!["nope".into()]).route(&batch(&[1], &[1]));
        assert!(missing.is_err());
    }
}
