//! What `#[orca::task]`, `orca::tasks!` and `tasks = ...` declare, without
//! processes: the task types, their JSON calls, and the pipeline's list.
//! (Running them, locally and on runners, is tests/tests/tasks_e2e.rs.)

use orca::{Ctx, Month, Pipeline, Result, Task, TaskSet};
use serde_json::json;

#[orca::task(Double, retries = 1, backoff_ms = 20)]
fn double(n: u64) -> Result<u64> {
    if n == 13 {
        return Err("13 is unlucky".into());
    }
    Ok(n * 2)
}

#[orca::task(Name)]
fn name(m: Month) -> Result<String> {
    Ok(format!("month {m}"))
}

orca::tasks!(Both = [Double, Name]);

#[orca::step(mapped)]
fn days(ctx: &mut Ctx, m: Month) -> Result<u64> {
    let rt = ctx.runtime::<Both>()?;
    let r = rt.remote::<Double>(u64::from(m.days()))?;
    rt.get(r)
}

orca::pipeline! {
    WithTasks = "with_tasks" [days],
    partitions = Monthly("2024-01"),
    tasks = Both,
}

orca::pipeline! {
    Listed = "listed" [days],
    partitions = Monthly("2024-01"),
    tasks = [Double],
}

#[test]
fn a_task_declares_its_name_types_retries_and_code() {
    assert_eq!(Double::NAME, "double");
    assert_eq!(Double::RETRIES, 1);
    assert_eq!(Double::BACKOFF_MS, 20);
    assert_eq!(Name::RETRIES, 3, "the default");
    assert_eq!(Name::BACKOFF_MS, 1000, "the default");
    assert_eq!(Double::CODE.len(), 32);
    assert_ne!(Double::CODE, Name::CODE);
    assert_eq!(Double::call(4).expect("call"), 8);
}

#[test]
fn a_set_lists_its_tasks_and_runs_them_on_json() {
    let tasks = Both::tasks();
    let names: Vec<&str> = tasks.iter().map(|t| t.name).collect();
    assert_eq!(names, ["double", "name"]);
    assert_eq!(tasks[0].input, "u64");
    assert!(tasks[1].input.ends_with("Month"), "{}", tasks[1].input);
    assert_eq!((tasks[0].run)(json!(21)), Ok(json!(42)));
    assert_eq!((tasks[0].run)(json!(13)), Err("13 is unlucky".to_string()));
    let e = (tasks[0].run)(json!("x")).expect_err("not a number");
    assert!(e.starts_with("task double: cannot decode its input"), "{e}");
    assert_eq!((tasks[1].run)(json!("2024-02")), Ok(json!("month 2024-02")));
}

#[test]
fn a_pipeline_declares_a_set_or_a_list_of_tasks() {
    let set: Vec<&str> = WithTasks::tasks().iter().map(|t| t.name).collect();
    assert_eq!(set, ["double", "name"]);
    let list: Vec<&str> = Listed::tasks().iter().map(|t| t.name).collect();
    assert_eq!(list, ["double"]);
}
