//! Tasks end to end with real processes: the `probe_tasks` pipeline (a step
//! that fans out `square` tasks and sums them) run by `orca-runner`s, its
//! tasks on local worker processes or on the runners' workers (fleet),
//! workers and drivers killed with SIGKILL, a run cancelled; and the
//! `fanout` example run in memory.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use orca_tests::procs::{bin, outputs, register, wait_run, Runner};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;

/// The sum of i² for i in 0..n: what a run of n tasks must return.
fn squares(n: u64) -> u64 {
    (0..n).map(|i| i * i).sum()
}

/// How many times each task ran, from the probe's `tasks.log`, and the
/// process each first ran in.
fn executions(dir: &std::path::Path) -> (HashMap<u64, usize>, HashMap<u64, u32>) {
    let mut count = HashMap::new();
    let mut pid = HashMap::new();
    for line in std::fs::read_to_string(dir.join("tasks.log"))
        .unwrap_or_default()
        .lines()
    {
        let mut f = line.split_whitespace();
        if let (Some(Ok(i)), Some(Ok(p))) = (f.next().map(str::parse), f.next().map(str::parse)) {
            *count.entry(i).or_default() += 1;
            pid.entry(i).or_insert(p);
        }
    }
    (count, pid)
}

/// A test database with `probe_tasks` registered, a scratch directory the
/// probe logs to, and a runner (`name`, one slot) with `env` besides
/// `PROBE_DIR`.
async fn setup(
    what: &str,
    name: &str,
    env: &[(&str, &str)],
) -> (TestDb, std::path::PathBuf, Runner) {
    let db = TestDb::new().await;
    register(&db, "probe_tasks");
    let logs = scratch(what);
    let dir = logs.to_string_lossy().to_string();
    let mut all = vec![("PROBE_DIR", dir.as_str())];
    all.extend_from_slice(env);
    let r = Runner::start(&db.url(), name, 1, &logs, &all);
    (db, logs, r)
}

async fn run_month(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT orca.run('probe_tasks', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run")
}

async fn output(db: &TestDb, run: i64) -> u64 {
    let v: serde_json::Value = sqlx::query_scalar(
        "SELECT output FROM orca.step_states WHERE run_id = $1 AND step = 'spread'",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("spread's output");
    v.as_u64().unwrap_or_else(|| panic!("output {v}"))
}

/// Waits until `tasks.log` has at least `n` lines.
async fn wait_for_tasks(dir: &std::path::Path, n: usize, runner: &Runner) {
    wait_until(
        &format!("{n} task executions"),
        Duration::from_secs(60),
        || async {
            let lines = std::fs::read_to_string(dir.join("tasks.log"))
                .unwrap_or_default()
                .lines()
                .count();
            (lines >= n).then_some(())
        },
        || runner.output(),
    )
    .await
}

fn sigkill(pid: u32) {
    let ok = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -KILL {pid}");
}

#[tokio::test]
async fn ten_thousand_tasks_over_two_runners_sum_to_the_known_total() {
    let db = TestDb::new().await;
    register(&db, "probe_tasks");
    let logs = scratch("tasks-fleet");
    let dir = logs.to_string_lossy().to_string();
    let env = [
        ("PROBE_DIR", dir.as_str()),
        ("PROBE_TASKS", "10000"),
        ("ORCA_TASKS", "fleet"),
        ("ORCA_TASK_WORKERS", "2"),
    ];
    let a = Runner::start(&db.url(), "host-a", 1, &logs, &env);
    let b = Runner::start(&db.url(), "host-b", 1, &logs, &env);
    let run = run_month(&db).await;
    // 10 000 tasks on two cores shared with the other tests of this file:
    // a generous wait (this is not a speed test), showing both runners.
    wait_for_sql(
        &db,
        &format!("run {run} to succeed"),
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(300),
        || outputs(&[&a, &b]),
    )
    .await;
    assert_eq!(
        output(&db, run).await,
        squares(10_000),
        "{}",
        outputs(&[&a, &b])
    );
    let (count, _) = executions(&logs);
    assert_eq!(count.len(), 10_000);
    assert!(count.values().all(|&c| c == 1), "a task ran twice");
    let runners = db
        .strings("SELECT DISTINCT runner FROM orca.tasks WHERE status = 'succeeded' ORDER BY 1")
        .await;
    assert_eq!(runners, ["host-a", "host-b"], "both runners ran tasks");
    let summary = sqlx::query_as::<_, (i64, i64, i64)>(
        "SELECT tasks, succeeded, failed FROM orca.task_overview WHERE run = $1",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("overview");
    assert_eq!(summary, (10_000, 10_000, 0));
}

#[tokio::test]
async fn a_worker_killed_mid_task_costs_only_that_task_a_retry() {
    for mode in ["fleet", "local"] {
        let (db, logs, r) = setup(
            &format!("tasks-kill-{mode}"),
            "host",
            &[
                ("PROBE_TASKS", "24"),
                ("PROBE_TASK_SLEEP_MS", "300"),
                ("ORCA_TASKS", mode),
                ("ORCA_TASK_WORKERS", "2"),
                ("ORCA_WORKERS", "2"),
            ],
        )
        .await;
        let run = run_month(&db).await;
        wait_for_tasks(&logs, 1, &r).await;
        let (_, pids) = executions(&logs);
        let victim = pids[&0];
        sigkill(victim);
        wait_run(&db, run, "succeeded", &r).await;
        assert_eq!(output(&db, run).await, squares(24), "{mode}");
        let (count, _) = executions(&logs);
        assert_eq!(count.len(), 24, "{mode}");
        assert_eq!(count[&0], 2, "{mode}: the killed task ran again");
        let again: Vec<_> = count.iter().filter(|(i, c)| **i != 0 && **c > 1).collect();
        assert!(again.is_empty(), "{mode}: others ran again: {again:?}");
        if mode == "fleet" {
            let tries = db
                .strings(&format!(
                    "SELECT index || ':' || status FROM orca.tasks WHERE run = {run} \
                     AND (index = 0 OR status <> 'succeeded') ORDER BY try"
                ))
                .await;
            assert_eq!(tries, ["0:retried", "0:succeeded"]);
            let error = db
                .strings(&format!(
                    "SELECT error FROM orca.tasks WHERE run = {run} AND status = 'retried'"
                ))
                .await;
            assert!(
                error[0].contains(&format!("task worker {victim}")) && error[0].contains("died"),
                "{error:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_driver_killed_mid_fan_out_resumes_without_running_a_finished_task_again() {
    // One slot: the run's next attempt waits for the killed one to end.
    let (db, logs, r) = setup(
        "tasks-driver",
        "host",
        &[
            ("PROBE_TASKS", "40"),
            ("PROBE_TASK_SLEEP_MS", "100"),
            ("ORCA_TASKS", "fleet"),
            ("ORCA_TASK_WORKERS", "2"),
        ],
    )
    .await;
    let run = run_month(&db).await;
    wait_for_tasks(&logs, 8, &r).await;
    let drivers = std::fs::read_to_string(logs.join("drivers.log")).unwrap_or_default();
    let first: u32 = drivers
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no driver in {drivers}"));
    sigkill(first);
    wait_run(&db, run, "succeeded", &r).await;
    assert_eq!(output(&db, run).await, squares(40));
    let drivers = std::fs::read_to_string(logs.join("drivers.log")).unwrap_or_default();
    assert_eq!(
        drivers.lines().count(),
        2,
        "a second attempt drove: {drivers}"
    );
    let (count, _) = executions(&logs);
    assert_eq!(count.len(), 40);
    assert!(
        count.values().all(|&c| c == 1),
        "no task ran twice: {count:?}\n{}",
        r.output()
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.tasks WHERE run = {run}"
        ))
        .await,
        40
    );
}

#[tokio::test]
async fn a_task_that_always_fails_fails_its_step_with_its_error_after_its_retries() {
    let (db, logs, r) = setup(
        "tasks-fail",
        "host",
        &[
            ("PROBE_TASKS", "10"),
            ("PROBE_TASK_FAIL", "7"),
            ("ORCA_TASKS", "fleet"),
            ("ORCA_TASK_WORKERS", "2"),
        ],
    )
    .await;
    let run = run_month(&db).await;
    wait_run(&db, run, "failed", &r).await;
    let error = db
        .strings(&format!(
            "SELECT error FROM orca.step_states WHERE run_id = {run} AND step = 'spread'"
        ))
        .await;
    assert!(
        error[0].contains("task square #7 failed after 3 tries: task 7 fails on purpose"),
        "{error:?}"
    );
    // Each try's error carries what the task wrote to stderr before it
    // failed, and only that try's lines (the pid is its worker's).
    let tries = db
        .strings(&format!(
            "SELECT error FROM orca.tasks WHERE run = {run} AND index = 7 AND error IS NOT NULL"
        ))
        .await;
    assert!(!tries.is_empty());
    for e in &tries {
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.first(), Some(&"task 7 fails on purpose"), "{e}");
        assert_eq!(
            lines.get(1),
            Some(&"--- the task's last log lines ---"),
            "{e}"
        );
        assert_eq!(lines.len(), 3, "{e}");
        assert!(lines[2].starts_with("square 7: about to fail (pid "), "{e}");
    }
    let (count, _) = executions(&logs);
    // Each of the run's three attempts reads the task's result; it ran
    // three times (its retries), not nine.
    assert_eq!(count[&7], 3, "{count:?}");
    assert!(count.iter().all(|(i, c)| *i == 7 || *c == 1), "{count:?}");
}

#[tokio::test]
async fn cancelling_a_run_stops_its_queued_tasks() {
    let (db, logs, r) = setup(
        "tasks-cancel",
        "host",
        &[
            ("PROBE_TASKS", "400"),
            ("PROBE_TASK_SLEEP_MS", "100"),
            ("ORCA_TASKS", "fleet"),
            ("ORCA_TASK_WORKERS", "1"),
        ],
    )
    .await;
    let run = run_month(&db).await;
    wait_for_tasks(&logs, 3, &r).await;
    db.pool
        .execute(format!("SELECT orca.cancel({run})").as_str())
        .await
        .expect("cancel");
    // The runner learns it at its next heartbeat (a second at most): from
    // then on nothing queued starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = executions(&logs).0.len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = executions(&logs).0.len();
    assert_eq!(
        settled,
        after,
        "tasks still start after the cancel\n{}",
        r.output()
    );
    assert!(after < 100, "{after} of 400 ran");
    let queued = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM orca.tasks WHERE run = {run} AND status IN ('queued', 'leased')"
        ))
        .await;
    assert_eq!(queued, 0);
    let cancelled = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM orca.tasks WHERE run = {run} AND status = 'cancelled'"
        ))
        .await;
    assert!(cancelled > 300, "{cancelled}");
}

#[tokio::test]
async fn the_fanout_example_counts_a_month_in_memory_on_local_workers() {
    let logs = scratch("fanout-mem");
    let out = Command::new(bin("fanout"))
        .args(["run", "--partitions", "2013-02"])
        .arg("--logs")
        .arg(&logs)
        .env("ORCA_WORKERS", "3")
        .env("ORCA_EXAMPLE_DATA", repo_root().join("examples/data"))
        .output()
        .expect("fanout run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the data says: February 2013's flights from the daily file.
    let csv = std::fs::read_to_string(repo_root().join("examples/data/flights-2013-daily.csv"))
        .expect("data");
    let expected: u64 = csv
        .lines()
        .filter(|l| l.starts_with("2013-02-"))
        .filter_map(|l| l.split(',').nth(2)?.parse::<u64>().ok())
        .sum();
    assert!(expected > 20_000, "{expected}");
    assert!(
        text.contains(&format!("year_flights *: {expected}")),
        "{text}"
    );
    // describe names the tasks, and the manifest carries them.
    let d = Command::new(bin("fanout"))
        .args(["describe", "--json"])
        .output()
        .expect("describe");
    let m: serde_json::Value = serde_json::from_slice(&d.stdout).expect("manifest");
    assert_eq!(m["tasks"][0]["name"], "day_flights");
    assert_eq!(m["tasks"][0]["retries"], 2);
}

#[tokio::test]
async fn locate_finds_each_task_and_register_records_it() {
    let db = TestDb::new().await;
    let dir = scratch("locate-tasks");
    let copy = dir.join("fanout");
    std::fs::copy(bin("fanout"), &copy).expect("copy the binary");
    let root = repo_root().join("examples/fanout");
    let out = orca_tests::procs::orca(
        &db,
        &[
            "locate",
            copy.to_str().unwrap_or_default(),
            "--root",
            root.to_str().unwrap_or_default(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let source = std::fs::read_to_string(root.join("src/main.rs")).expect("source");
    let line_of = |needle: &str| {
        source
            .lines()
            .position(|l| l.starts_with(needle))
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("{needle} not in the example"))
    };
    let located: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("fanout.source.json")).expect("sidecar"),
    )
    .expect("sidecar JSON");
    assert_eq!(located["tasks"]["day_flights"]["file"], "src/main.rs");
    assert_eq!(
        located["tasks"]["day_flights"]["line"],
        line_of("fn day_flights(")
    );
    assert_eq!(
        located["steps"]["month_flights"]["line"],
        line_of("fn month_flights(")
    );
    let out = orca_tests::procs::orca(&db, &["register", copy.to_str().unwrap_or_default()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored: serde_json::Value =
        sqlx::query_scalar("SELECT manifest->'locations'->'tasks' FROM orca.pipeline_versions")
            .fetch_one(&db.pool)
            .await
            .expect("manifest");
    assert_eq!(stored["day_flights"]["line"], line_of("fn day_flights("));
}

#[tokio::test]
async fn a_binarys_idle_workers_are_stopped_and_started_again_for_its_next_batch() {
    let (db, logs, r) = setup(
        "tasks-idle",
        "host",
        &[
            ("PROBE_TASKS", "6"),
            ("ORCA_TASKS", "fleet"),
            ("ORCA_TASK_WORKERS", "2"),
            ("ORCA_TASK_IDLE_SECONDS", "1"),
        ],
    )
    .await;
    let run = run_month(&db).await;
    wait_run(&db, run, "succeeded", &r).await;
    let (_, first) = executions(&logs);
    let workers: std::collections::BTreeSet<u32> = first.values().copied().collect();
    wait_until(
        "the idle workers to be stopped",
        Duration::from_secs(30),
        || async {
            let alive = workers
                .iter()
                .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
                .count();
            (alive == 0 && r.output().contains("idle task worker(s)")).then_some(())
        },
        || r.output(),
    )
    .await;
    // The next run's batch starts new ones.
    std::fs::remove_file(logs.join("tasks.log")).expect("clear the log");
    let again: i64 = sqlx::query_scalar("SELECT orca.run('probe_tasks', '2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, again, "succeeded", &r).await;
    assert_eq!(output(&db, again).await, squares(6));
    let (_, second) = executions(&logs);
    assert!(
        second.values().all(|p| !workers.contains(p)),
        "new worker processes: {second:?} after {workers:?}"
    );
}
