//! Staging an epoch: each chunk becomes a batch (typed columns as they came,
//! raw records normalized, what cannot be normalized quarantined), the cells
//! the destination cannot take are held, and each writer lane stages its
//! key groups' rows as Parquet. Then the epoch's record, not yet written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray};
use bytes::Bytes;
use serde_json::json;

use crate::attempt::barrier::{Chunk, Taken};
use crate::attempt::open::Opened;
use crate::attempt::state::{Attempt, Progress};
use crate::commit::record::{LaneCommittable, Record, Refresh, Staged};
use crate::commit::route::{LaneInput, Router};
use crate::dest::parquet::{encode, encode_threads};
use crate::error::EngineError;
use crate::ids::{conform, ORCA_ID};
use crate::source::normalize::normalize;
use crate::source::readers::Shape;

/// What an epoch staged, by writer lane, and set aside.
pub(super) struct Staging {
    pub(super) lanes: Vec<Vec<Staged>>,
    /// Files of records that could not be normalized.
    pub(super) quarantined: Vec<String>,
    /// Files of cells the destination could not take.
    pub(super) held: Vec<String>,
}

impl Attempt {
    /// Stages every chunk of epoch `epoch` and moves each stream's state on
    /// to the resume point after its chunk.
    pub(super) fn stage(
        &mut self,
        p: &mut Progress,
        epoch: u64,
        synced_at: i64,
        chunks: Vec<Chunk>,
        opened: &mut Opened,
    ) -> Result<Staging, EngineError> {
        let Opened {
            readers,
            routers,
            lanes,
        } = opened;
        let lanes = *lanes;
        let mut staging = Staging {
            lanes: vec![Vec::new(); lanes],
            quarantined: Vec::new(),
            held: Vec::new(),
        };
        for Chunk {
            stream: name,
            taken,
            last,
        } in chunks
        {
            // A change stream's round may bring a stream nothing: it moves
            // to the round's point without staging a file.
            if let Taken::Typed { rows: 0, .. } = &taken {
                p.states.entry(name.clone()).or_default().position = Some(last);
                continue;
            }
            let batch = match taken {
                Taken::Typed {
                    schema,
                    arrays,
                    ids,
                    rows,
                } => typed_batch(&name, schema, arrays, ids, rows, epoch, synced_at)?,
                Taken::Raw(records) => {
                    let Some(Shape::Inferred(schema)) = readers
                        .iter_mut()
                        .find(|r| r.name == name)
                        .map(|r| &mut r.shape)
                    else {
                        return Err(EngineError::Reader {
                            stream: name,
                            reason: "records from a typed stream".into(),
                        });
                    };
                    let mut good = Vec::with_capacity(records.len());
                    let mut bad = Vec::new();
                    for (i, r) in records.into_iter().enumerate() {
                        match r {
                            Ok(mut raw) => {
                                raw.seq = seq(epoch, i);
                                good.push(raw);
                            }
                            Err((raw, reason)) => bad.push((raw.position, raw.record, reason)),
                        }
                    }
                    let (batch, set_aside) = normalize(&name, schema, &good, synced_at)?;
                    // The columns named so far, kept with the stream's state.
                    let names = schema.renamed().clone();
                    p.states.entry(name.clone()).or_default().names = names;
                    bad.extend(
                        set_aside
                            .into_iter()
                            .map(|q| (q.position, q.record, q.reason)),
                    );
                    if !bad.is_empty() {
                        let path = self.layout.quarantine(epoch, self.generation, &name);
                        let mut body = String::new();
                        for (position, record, reason) in &bad {
                            body.push_str(
                                &json!({"stream": name, "position": position,
                                        "reason": reason, "record": record})
                                .to_string(),
                            );
                            body.push('\n');
                        }
                        self.store.put(&path, Bytes::from(body))?;
                        p.out.quarantined += bad.len() as u64;
                        staging.quarantined.push(path);
                    }
                    batch
                }
            };
            let (batch, held) = self.dest.hold(&name, batch)?;
            if !held.is_empty() {
                let path = self.layout.held(epoch, self.generation, &name);
                let mut body = String::new();
                for h in &held {
                    body.push_str(
                        &json!({"stream": name, "_orca_id": h.orca_id, "column": h.column,
                                          "value": h.value, "reason": h.reason})
                        .to_string(),
                    );
                    body.push('\n');
                }
                self.store.put(&path, Bytes::from(body))?;
                p.out.held += held.len() as u64;
                staging.held.push(path);
            }
            let schema = batch.schema();
            let rows = batch.num_rows();
            // Each writer lane stages its key groups' rows; the lanes encode
            // at the same time.
            let parts = lane_parts(routers.get(&name), lanes, batch)?;
            let encoded = encode_lanes(&parts)?;
            for ((lane, part), data) in parts.iter().zip(encoded) {
                let path = self.layout.staged(epoch, self.generation, &name, *lane);
                let bytes = data.len() as u64;
                self.store.put(&path, data)?;
                p.out.staged_bytes += bytes;
                staging.lanes[*lane].push(Staged {
                    stream: name.clone(),
                    path,
                    rows: part.num_rows() as u64,
                    bytes,
                    lane: *lane,
                });
            }
            p.out.rows += rows as u64;
            let st = p.states.entry(name.clone()).or_default();
            st.position = Some(last);
            st.rows += rows as u64;
            st.schema = schema_pairs(&schema);
        }
        Ok(staging)
    }

    /// Epoch `epoch`'s record: every stream's state after it, its lanes'
    /// staged files, and the refresh steps of the `overwrite` streams.
    /// `ended`: the streams whose refresh or backfill ends with it.
    pub(super) fn record(
        &self,
        p: &mut Progress,
        epoch: u64,
        staging: Staging,
        ended: &[String],
    ) -> Record {
        for s in &self.streams {
            p.states.entry(s.clone()).or_default();
        }
        for name in ended {
            p.states.entry(name.clone()).or_default().rereading = false;
        }
        let refresh = refresh_steps(&self.overwrite, ended, &staging.lanes, &mut p.begins);
        for (name, step) in &refresh {
            if step.ends {
                p.states.entry(name.clone()).or_default().refreshed = true;
            }
        }
        Record {
            sync: self.opts.sync.clone(),
            epoch,
            generation: self.generation,
            previous: p.previous.clone(),
            streams: p.states.clone(),
            committables: staging
                .lanes
                .into_iter()
                .enumerate()
                .map(|(lane, staged)| LaneCommittable { lane, staged })
                .collect(),
            quarantined: staging.quarantined,
            held: staging.held,
            refresh,
            written_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }
}

/// A row's `_orca_seq`: its epoch, then its place in the epoch's chunk, so
/// that a later version of a row sorts after an earlier one.
fn seq(epoch: u64, i: usize) -> i64 {
    ((epoch as i64) << 32) | i as i64
}

/// A typed chunk as a batch of the destination's schema: its columns,
/// `_orca_id` (in the stream's form), `_orca_seq` and `_orca_synced_at`.
#[allow(clippy::too_many_arguments)]
fn typed_batch(
    stream: &str,
    schema: Arc<arrow_schema::Schema>,
    mut arrays: Vec<ArrayRef>,
    ids: ArrayRef,
    rows: usize,
    epoch: u64,
    synced_at: i64,
) -> Result<RecordBatch, EngineError> {
    let seq: Int64Array = (0..rows).map(|i| seq(epoch, i)).collect();
    let at = TimestampMicrosecondArray::from(vec![synced_at; rows]).with_timezone("UTC");
    // The source made one form of id; the stream keeps the one it began with.
    let ids = match schema.field_with_name(ORCA_ID) {
        Ok(f) => conform(ids, f.data_type()).map_err(|e| EngineError::Reader {
            stream: stream.to_string(),
            reason: e.to_string(),
        })?,
        Err(_) => ids,
    };
    arrays.extend([ids, Arc::new(seq) as ArrayRef, Arc::new(at) as ArrayRef]);
    Ok(RecordBatch::try_new(schema, arrays)?)
}

/// A stream's batch split over the writer lanes by its router: one part per
/// lane that gets rows. With one lane (or no router) the batch is lane 0's.
fn lane_parts(
    router: Option<&Router>,
    lanes: usize,
    batch: RecordBatch,
) -> Result<Vec<(usize, RecordBatch)>, EngineError> {
    Ok(match router {
        Some(router) if lanes > 1 => router
            .route(&batch)?
            .into_iter()
            .filter_map(|(lane, input)| match input {
                LaneInput::Rows(b) => Some((lane, b)),
                LaneInput::Barrier { .. } => None,
            })
            .collect(),
        _ => vec![(0, batch)],
    })
}

/// Each lane's part encoded as Parquet, the lanes on threads of their own.
fn encode_lanes(parts: &[(usize, RecordBatch)]) -> Result<Vec<Bytes>, EngineError> {
    let threads = encode_threads(parts.len());
    if let [(_, only)] = parts {
        return Ok(vec![encode(only, threads)?]);
    }
    std::thread::scope(|scope| {
        let jobs: Vec<_> = parts
            .iter()
            .map(|(_, b)| scope.spawn(move || encode(b, threads)))
            .collect();
        jobs.into_iter()
            .map(|j| match j.join() {
                Ok(r) => r.map_err(EngineError::from),
                Err(_) => Err(EngineError::Reader {
                    stream: "(writer lane)".into(),
                    reason: "a writer lane's encoder panicked".into(),
                }),
            })
            .collect()
    })
}

/// What this epoch does to each `overwrite` stream's refresh: a step for
/// every stream whose refresh begins, stages rows or ends in it. A refresh
/// begins once: its stream leaves `begins`.
fn refresh_steps(
    overwrite: &BTreeSet<String>,
    ended: &[String],
    staged: &[Vec<Staged>],
    begins: &mut BTreeSet<String>,
) -> BTreeMap<String, Refresh> {
    let mut refresh = BTreeMap::new();
    for name in overwrite {
        let ends = ended.contains(name);
        if ends || staged.iter().flatten().any(|f| &f.stream == name) || begins.contains(name) {
            let step = Refresh {
                begins: begins.remove(name),
                ends,
            };
            refresh.insert(name.clone(), step);
        }
    }
    refresh
}

fn schema_pairs(schema: &arrow_schema::Schema) -> Vec<(String, String)> {
    schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::StringArray;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn staged(stream: &str, lane: usize) -> Staged {
        Staged {
            stream: stream.into(),
            path: format!("{stream}-{lane}.parquet"),
            rows: 1,
            bytes: 1,
            lane,
        }
    }

    #[test]
    fn a_refresh_begins_once_and_ends_with_the_epoch_its_source_ran_out_in() {
        let overwrite = set(&["prices", "rates", "idle"]);
        let mut begins = set(&["prices", "rates"]);
        // Epoch 1: prices staged rows on lane 1, rates read nothing yet.
        let lanes = vec![vec![staged("orders", 0)], vec![staged("prices", 1)]];
        let steps = refresh_steps(&overwrite, &[], &lanes, &mut begins);
        let begun = Refresh {
            begins: true,
            ends: false,
        };
        assert_eq!(steps["prices"], begun);
        // A refresh that begins says so even in an epoch that read none of it.
        assert_eq!(steps["rates"], begun);
        assert!(!steps.contains_key("idle") && !steps.contains_key("orders"));
        assert!(begins.is_empty());

        // Epoch 2: prices ran out.
        let lanes = vec![vec![], vec![]];
        let steps = refresh_steps(&overwrite, &["prices".to_string()], &lanes, &mut begins);
        assert_eq!(
            steps["prices"],
            Refresh {
                begins: false,
                ends: true
            }
        );
        assert_eq!(steps.len(), 1, "{steps:?}");
    }

    fn orders(ids: &[i64]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("_orca_id", DataType::Utf8, false),
            ])),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(
                    ids.iter().map(|i| format!("o{i}")).collect::<Vec<_>>(),
                )),
            ],
        )
        .expect("batch")
    }

    #[test]
    fn each_lane_stages_its_keys_rows_and_no_row_is_lost() {
        let ids: Vec<i64> = (0..100).map(|i| i % 13).collect();
        let router = Router::new(4, vec!["id".into()]);
        let parts = lane_parts(Some(&router), 4, orders(&ids)).expect("parts");
        assert!(parts.len() > 1, "rows spread over the lanes");
        let mut lane_of = BTreeMap::new();
        let mut total = 0;
        for (lane, part) in &parts {
            total += part.num_rows();
            for id in part.column(0).as_primitive::<Int64Type>().values() {
                assert_eq!(*lane_of.entry(*id).or_insert(*lane), *lane, "key {id}");
            }
        }
        assert_eq!(total, ids.len());

        // One lane: the batch as it is, on lane 0.
        let one =
            lane_parts(Some(&Router::new(1, vec!["id".into()])), 1, orders(&ids)).expect("parts");
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].0, one[0].1.num_rows()), (0, ids.len()));
    }

    #[test]
    fn a_typed_chunk_gets_its_ids_in_the_streams_form_then_a_sequence_by_epoch_and_the_sync_time() {
        use crate::ids::{self, IdForm};
        // The stream's schema: its column, then the metadata columns.
        let schema = |form: IdForm| {
            let mut fields = vec![Field::new("id", DataType::Int64, false)];
            fields.extend(crate::source::postgres::table::metadata_fields(form));
            Arc::new(Schema::new(fields))
        };
        // What a table's reader makes: 16 bytes an id, staged in `form`.
        let stage = |form: IdForm| {
            let source_ids: ArrayRef = Arc::new(
                arrow_array::FixedSizeBinaryArray::try_from_iter(
                    [ids::bytes(1, 2), ids::bytes(3, 4)].into_iter(),
                )
                .expect("ids"),
            );
            let arrays: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![1, 2]))];
            typed_batch(
                "orders",
                schema(form),
                arrays,
                source_ids,
                2,
                3,
                1_700_000_000_000_000,
            )
            .expect("batch")
        };
        let b = stage(IdForm::Bytes);
        assert_eq!(
            b.column(1).as_fixed_size_binary().value(1),
            ids::bytes(3, 4)
        );
        // A stream recorded with hex ids keeps getting hex.
        let old = stage(IdForm::Hex);
        let hex: Vec<&str> = old.column(1).as_string::<i32>().iter().flatten().collect();
        assert_eq!(hex, [ids::text(1, 2), ids::text(3, 4)]);
        let seqs: Vec<i64> = b.column(2).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(seqs, [3 << 32, (3 << 32) | 1]);
        let at = b
            .column(3)
            .as_primitive::<arrow_array::types::TimestampMicrosecondType>();
        assert!(at.values().iter().all(|t| *t == 1_700_000_000_000_000));
        // A later epoch's rows sort after every row of an earlier one.
        assert!(seq(4, 0) > seq(3, u32::MAX as usize));
    }
}
