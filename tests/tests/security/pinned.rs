//! Pinned binaries: a runner runs only the registered file under its
//! pipeline root, and hides its token and the lease from other users.

use super::*;

/// The whole way through: a runner logged in as an ordinary role with a
/// token runs the registered binary, and refuses any other file.
#[tokio::test]
async fn a_runner_runs_only_the_pinned_binary_and_hides_its_secrets() {
    let db = TestDb::new().await;
    roles(&db).await;
    register(&db, &bin("probe"));
    let probe_sha: String = sqlx::query_scalar("SELECT binary_sha256 FROM orca.pipeline_versions")
        .fetch_one(&db.pool)
        .await
        .expect("orca register pinned the binary");
    assert_eq!(probe_sha.len(), 64);
    let token: String = sqlx::query_scalar("SELECT orca.create_runner_token('default', 'r1')")
        .fetch_one(&db.pool)
        .await
        .expect("token");
    let logs = scratch("pinned");
    let token_file = logs.join("token");
    std::fs::write(&token_file, &token).expect("token file");
    let probe_dir = logs.to_string_lossy().to_string();
    let token_path = token_file.to_string_lossy().to_string();
    let env = [
        ("PROBE_DIR", probe_dir.as_str()),
        ("PROBE_SLEEP_MS", "1500"),
        ("ORCA_RUNNER_TOKEN_FILE", token_path.as_str()),
    ];
    let runner = Runner::start(&url_as(&db, RUNNER_LOGIN), "r1", 2, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    // While it runs: the lease is on no command line, and the child has no
    // runner token in its environment.
    let lease: uuid::Uuid = wait_until(
        "the attempt to be leased",
        Duration::from_secs(60),
        || async {
            sqlx::query_scalar::<_, uuid::Uuid>(
                "SELECT lease FROM orca.attempts WHERE run_id = $1 AND status = 'leased'",
            )
            .bind(run)
            .fetch_optional(&db.pool)
            .await
            .ok()
            .flatten()
        },
        || outputs(&[&runner]),
    )
    .await;
    let child_env = wait_until(
        "the pipeline binary to start with its lease",
        Duration::from_secs(60),
        || async { child_with_lease(&lease) },
        || outputs(&[&runner]),
    )
    .await;
    assert!(
        !child_env.contains(&token) && !child_env.contains("ORCA_RUNNER_TOKEN"),
        "the child sees the runner's token"
    );
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            !cmdline.contains(&lease.to_string()),
            "the lease is on a command line: {cmdline}"
        );
    }
    wait_for_sql(
        &db,
        "the pinned run to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(120),
        || outputs(&[&runner]),
    )
    .await;

    // An operator points versions at other files: none of them runs.
    let outside = logs.join("evil.sh");
    std::fs::write(&outside, "#!/bin/sh\ntouch \"$0.ran\"\n").expect("script");
    let sha_of = |p: &std::path::Path| {
        use sha2::{Digest, Sha256};
        let bytes = std::fs::read(p).expect("read");
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let cases = [
        (
            "outside",
            outside.display().to_string(),
            sha_of(&outside),
            "outside this runner's pipeline root",
        ),
        (
            "shell",
            "/bin/sh".to_string(),
            sha_of(std::path::Path::new("/bin/sh")),
            "outside this runner's pipeline root",
        ),
        (
            "bare",
            "true".to_string(),
            probe_sha.clone(),
            "No such file",
        ),
        (
            "escape",
            "../../../../../../bin/true".to_string(),
            probe_sha.clone(),
            "outside this runner's pipeline root",
        ),
        (
            "other_hash",
            bin("probe").display().to_string(),
            "0".repeat(64),
            "but version",
        ),
    ];
    for (name, binary, sha, _) in &cases {
        let mut m = lake_manifest(&format!("evil_{name}"));
        m["binary"] = json!(binary);
        m["binary_sha256"] = json!(sha);
        m["run_retries"] = json!(0);
        db.register(&m).await;
        db.pool
            .execute(format!("SELECT orca.run('evil_{name}', '2024-01')").as_str())
            .await
            .expect("queue it");
    }
    for (name, binary, sha, says) in &cases {
        let error: String = wait_until(
            &format!("evil_{name} to fail"),
            Duration::from_secs(60),
            || async {
                sqlx::query_scalar::<_, Option<String>>(
                    "SELECT r.error FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
                     WHERE p.name = $1 AND r.status = 'failed'",
                )
                .bind(format!("evil_{name}"))
                .fetch_optional(&db.pool)
                .await
                .ok()
                .flatten()
                .flatten()
            },
            || outputs(&[&runner]),
        )
        .await;
        assert!(error.contains(says), "evil_{name}: {error}");
        if *name == "other_hash" {
            assert!(
                error.contains(&probe_sha)
                    && error.contains(sha.as_str())
                    && error.contains(binary.as_str()),
                "names the path and both hashes: {error}"
            );
        }
    }
    assert!(!logs.join("evil.sh.ran").exists(), "the script ran");
    drop(runner);
    let _ = std::fs::remove_dir_all(&logs);
}
