//! The driver without a control plane: order, inputs, retries, and resuming
//! from stored states.

use std::sync::atomic::{AtomicU32, Ordering};

use orca::{execute, Ctx, MemStore, Month, Pipeline, Result, Store};

static LOADS: AtomicU32 = AtomicU32::new(0);
static FLAKY: AtomicU32 = AtomicU32::new(0);

#[orca::step(mapped)]
fn load(_ctx: &mut Ctx, m: Month) -> Result<u32> {
    LOADS.fetch_add(1, Ordering::SeqCst);
    Ok(m.days())
}

#[orca::step(mapped, after = load, retries = 2)]
fn flaky(ctx: &mut Ctx, days: u32) -> Result<u32> {
    FLAKY.fetch_add(1, Ordering::SeqCst);
    if ctx.partition == "2024-02" && ctx.attempt < 3 {
        return Err(format!("attempt {} fails", ctx.attempt).into());
    }
    Ok(days * 2)
}

#[orca::step(gather, after = flaky)]
fn sum(_ctx: &mut Ctx, all: Vec<u32>) -> Result<u32> {
    Ok(all.iter().sum())
}

orca::pipeline! {
    P = "p" [load, flaky, sum],
    partitions = Monthly("2024-01"),
}

fn parts() -> Vec<String> {
    vec!["2024-01".into(), "2024-02".into()]
}

#[test]
fn runs_in_order_retries_and_resumes_without_redoing_work() {
    let steps = P::steps();
    let log = orca_log();
    let mut store = MemStore::default();
    let out = execute("p", None, &steps, &[], &parts(), &mut store, &log, None);
    assert!(out.ok(), "{:?}", out.error);
    // 31*2 + 29*2, with 2024-02's flaky step succeeding on its third try.
    let total = store.state("sum", "*").and_then(|s| s.output.clone());
    assert_eq!(total, Some(serde_json::json!(120)));
    assert_eq!(store.state("flaky", "2024-02").map(|s| s.attempts), Some(3));
    assert_eq!(LOADS.load(Ordering::SeqCst), 2);
    assert_eq!(FLAKY.load(Ordering::SeqCst), 4);

    // A second execution over the same states runs nothing again.
    let again = execute("p", None, &steps, &[], &parts(), &mut store, &log, None);
    assert!(again.ok());
    assert!(again
        .reports
        .iter()
        .all(|r| r.result == orca::StepResult::Skipped));
    assert_eq!(LOADS.load(Ordering::SeqCst), 2);

    // Different code for a step (a different code hash stored) reruns it,
    // and only it: its output is the same, so the rest stays skipped.
    if let Some(s) = store
        .states
        .get_mut(&("flaky".to_string(), "2024-01".to_string()))
    {
        s.code = Some("older".into());
    }
    let third = execute("p", None, &steps, &[], &parts(), &mut store, &log, None);
    assert!(third.ok());
    let ran: Vec<_> = third
        .reports
        .iter()
        .filter(|r| r.result != orca::StepResult::Skipped)
        .map(|r| format!("{} {}", r.step, r.partition))
        .collect();
    assert_eq!(ran, ["flaky 2024-01"]);
}

fn orca_log() -> orca::LogSink {
    orca::LogSink::stdout()
}
