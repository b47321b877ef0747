//! Runner tokens and leases: a runner acts for its token's org and pool and
//! on the leases it holds; a lease allows its attempt's calls and nothing
//! else; only admins move the clock or a sync's HEAD by hand.

use super::*;

#[tokio::test]
async fn runners_work_only_with_a_token_for_their_org_pool_and_leases() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let acme = token(&db, "acme", "default", "host-a").await;
    let acme_b = token(&db, "acme", "default", "host-b").await;
    let gpu = token(&db, "acme", "gpu", "gpu-1").await;
    let globex = token(&db, "globex", "default", "g-1").await;
    assert_ne!(acme, acme_b);
    assert!(acme.len() >= 64 + 8, "{acme}");

    // No token: the login alone does nothing, whatever org it names.
    let mut bare = connect_org(&db, RUNNER_LOGIN, "acme").await;
    for sql in [
        "SELECT * FROM orca.claim('r')",
        "SELECT orca.register_runner('r')",
        "SELECT orca.heartbeat(gen_random_uuid())",
        "SELECT orca.finish(gen_random_uuid(), true)",
        "SELECT orca.release(gen_random_uuid())",
    ] {
        assert_eq!(code_of(&mut bare, sql).await, "OR080", "{sql}");
    }
    let mut forged = runner_session(&db, &format!("{acme}0")).await;
    assert_eq!(
        code_of(&mut forged, "SELECT * FROM orca.claim('r')").await,
        "OR080"
    );

    // A token is for its org and pool.
    let mut a = runner_session(&db, &acme).await;
    assert_eq!(
        code_of(&mut a, "SELECT * FROM orca.claim('r', 'gpu')").await,
        "OR081"
    );
    a.execute("SET orca.org = 'globex'").await.expect("set");
    assert_eq!(
        code_of(&mut a, "SELECT * FROM orca.claim('r')").await,
        "OR081"
    );
    a.execute("RESET orca.org").await.expect("reset");
    let mine = claim_leases(&mut a, "host-a", 2).await;
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|(_, org)| org == "acme"), "{mine:?}");
    let mut g = runner_session(&db, &globex).await;
    let theirs = claim_leases(&mut g, "g-1", 1).await;
    assert_eq!(theirs[0].1, "globex");
    let mut p = runner_session(&db, &gpu).await;
    assert!(
        sqlx::query("SELECT * FROM orca.claim('gpu-1', 'gpu')")
            .fetch_all(&mut p)
            .await
            .expect("gpu claim")
            .is_empty(),
        "the gpu pool has no work"
    );

    // Only leases its own token holds: another runner of the same org and
    // pool cannot heartbeat, finish or release them; another org's runner
    // does not even find them.
    let (lease, _) = mine[0];
    let mut b = runner_session(&db, &acme_b).await;
    for sql in [
        format!("SELECT orca.heartbeat('{lease}')"),
        format!("SELECT orca.finish('{lease}', true)"),
        format!("SELECT orca.finish('{lease}', false, 'x')"),
        format!("SELECT orca.release('{lease}')"),
        format!("SELECT orca.finish_many(ARRAY['{lease}'::uuid])"),
    ] {
        assert_eq!(code_of(&mut b, &sql).await, "OR082", "{sql}");
        assert_eq!(code_of(&mut g, &sql).await, "OR012", "{sql}");
    }
    let status: String = sqlx::query_scalar("SELECT status FROM orca.attempts WHERE lease = $1")
        .bind(lease)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "leased", "nothing changed");
    a.execute(format!("SELECT orca.heartbeat('{lease}')").as_str())
        .await
        .expect("its own runner heartbeats it");

    // Tokens are listed, never read back: only their hashes are stored,
    // and a viewer cannot read those.
    let mut v = connect_org(&db, VIEWER, "acme").await;
    let listed: Vec<(String, String)> =
        sqlx::query_as("SELECT name, pool FROM orca.runner_tokens ORDER BY name")
            .fetch_all(&mut v)
            .await
            .expect("viewer lists tokens");
    assert_eq!(
        listed,
        [
            ("gpu-1".to_string(), "gpu".to_string()),
            ("host-a".into(), "default".into()),
            ("host-b".into(), "default".into())
        ]
    );
    assert_eq!(
        code_of(&mut v, "SELECT hash FROM orca.runner_tokens").await,
        "42501"
    );
    assert_eq!(
        code_of(&mut v, "SELECT lease FROM orca.attempts").await,
        "42501"
    );
    assert_eq!(
        code_of(&mut v, "SELECT lease FROM orca.leases").await,
        "42501"
    );
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orca.runner_tokens t \
         WHERE t.hash = sha256(convert_to($1, 'UTF8')) AND position($1 IN to_jsonb(t)::text) = 0",
    )
    .bind(&acme)
    .fetch_one(&db.pool)
    .await
    .expect("stored hashed");
    assert_eq!(stored, 1);
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    assert_eq!(
        code_of(
            &mut op,
            "SELECT orca.create_runner_token('default', 'host-a')"
        )
        .await,
        "OR050"
    );
    assert_eq!(
        code_of(&mut op, "SELECT orca.revoke_runner_token('g-1')").await,
        "OR083",
        "globex's token is not acme's to revoke"
    );

    // Rotation: the new secret works at once, the old one for its grace.
    let rotated: String =
        sqlx::query_scalar("SELECT orca.rotate_runner_token('host-b', interval '1 hour')")
            .fetch_one(&mut op)
            .await
            .expect("rotate");
    let mut b2 = runner_session(&db, &rotated).await;
    b2.execute("SELECT orca.register_runner('host-b')")
        .await
        .expect("new secret");
    b.execute("SELECT orca.register_runner('host-b')")
        .await
        .expect("old secret within its grace");
    sqlx::query("SELECT orca.rotate_runner_token('host-b', interval '0')")
        .fetch_one(&mut op)
        .await
        .expect("rotate without grace");
    assert_eq!(
        code_of(&mut b2, "SELECT orca.register_runner('host-b')").await,
        "OR080",
        "rotated out"
    );

    // Revocation: the next call fails and the token's leases lapse now.
    op.execute("SELECT orca.revoke_runner_token('host-a')")
        .await
        .expect("revoke");
    assert_eq!(
        code_of(&mut a, &format!("SELECT orca.heartbeat('{lease}')")).await,
        "OR080"
    );
    let t: Value = sqlx::query_scalar("SELECT orca.tick()")
        .fetch_one(&mut connect_org(&db, "postgres", "acme").await)
        .await
        .expect("tick");
    assert_eq!(t["attempts_lost"], json!(2), "{t}");
}

#[tokio::test]
async fn a_lease_allows_its_attempt_s_calls_and_nothing_else() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let acme = token(&db, "acme", "default", "host-a").await;
    let mut r = runner_session(&db, &acme).await;
    let leases = claim_leases(&mut r, "host-a", 2).await;
    let (lease, other) = (leases[0].0, leases[1].0);

    // The child's login is in no org: the lease says which attempt it is.
    let mut child = db.connect_as(ATTEMPT_LOGIN).await;
    let ctx: Value = sqlx::query_scalar("SELECT orca.attempt_context($1)")
        .bind(lease)
        .fetch_one(&mut child)
        .await
        .expect("its own context");
    assert_eq!(ctx["pipeline"], "lake", "{ctx}");
    let part = ctx["partitions"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    sqlx::query("SELECT orca.report_step($1, 'one', $2, 'running')")
        .bind(lease)
        .bind(&part)
        .execute(&mut child)
        .await
        .expect("reports its step");
    // Nothing a runner or operator does, and no table.
    for sql in [
        "SELECT * FROM orca.claim('x')".to_string(),
        "SELECT orca.tick()".to_string(),
        format!("SELECT orca.finish('{other}', true)"),
        format!("SELECT orca.finish('{lease}', true)"),
        format!("SELECT orca.heartbeat('{other}')"),
        "SELECT count(*) FROM orca.runs".to_string(),
        "SELECT count(*) FROM orca.attempts".to_string(),
        "SELECT orca.backfill('lake', '2024-01')".to_string(),
        "SELECT orca.create_runner_token('default')".to_string(),
    ] {
        assert_eq!(code_of(&mut child, &sql).await, "42501", "{sql}");
    }
    // A made-up lease, or one named in another org, is unknown.
    assert_eq!(
        code_of(
            &mut child,
            &format!("SELECT orca.attempt_context('{}')", uuid::Uuid::new_v4())
        )
        .await,
        "OR012"
    );
    child.execute("SET orca.org = 'globex'").await.expect("set");
    assert_eq!(
        code_of(
            &mut child,
            &format!("SELECT orca.attempt_context('{lease}')")
        )
        .await,
        "OR012"
    );
    child.execute("RESET orca.org").await.expect("reset");
    // It stops working when the lease ends.
    r.execute(format!("SELECT orca.finish('{lease}', true)").as_str())
        .await
        .expect("the runner finishes it");
    assert_eq!(
        code_of(
            &mut child,
            &format!("SELECT orca.report_step('{lease}', 'one', '{part}', 'succeeded')")
        )
        .await,
        "OR014"
    );
}

#[tokio::test]
async fn only_admins_move_the_clock() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let mut c = connect_org(&db, "postgres", "acme").await;
    sqlx::query("SELECT orca.register($1)")
        .bind(daily_manifest("daily", "0 6 * * *", "UTC"))
        .execute(&mut c)
        .await
        .expect("a scheduled pipeline");
    c.execute("SELECT orca.tick()").await.expect("tick now");
    let runs = "SELECT count(*) FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
                WHERE p.name = 'daily'";
    let before = db.scalar_i64(runs).await;
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    for sql in [
        "SELECT orca.tick(now() + interval '30 days')",
        "SELECT orca.tick('2100-01-01')",
        "SELECT orca.tick(now() - interval '1 day')",
    ] {
        let (code, msg) = expect_error(&mut op, sql).await;
        assert_eq!(code, "OR086", "{sql}: {msg}");
    }
    assert_eq!(db.scalar_i64(runs).await, before, "no schedule fired early");
    op.execute("SELECT orca.tick(now())")
        .await
        .expect("the transaction's time is anyone's");
    let t: Value = sqlx::query_scalar("SELECT orca.tick(now() + interval '30 days')")
        .fetch_one(&mut c)
        .await
        .expect("an admin moves the clock");
    assert!(db.scalar_i64(runs).await > before, "{t}");
}

#[tokio::test]
async fn a_sync_s_head_moves_only_under_its_lease_and_within_its_prefix() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let mut admin = connect_org(&db, "postgres", "acme").await;
    admin
        .execute("SELECT orca.allow('acme', '/in'), orca.allow('acme', '/out')")
        .await
        .expect("allow the sync's paths");
    for name in ["shop", "other"] {
        sqlx::query(
            "SELECT orca.create_sync($1, '{\"type\": \"files\", \"url\": \"/in\", \"format\": \"jsonl\"}', \
             '{\"type\": \"parquet\", \"url\": \"/out\"}', '[{\"name\": \"events\", \"pattern\": \"*.jsonl\"}]')",
        )
        .bind(name)
        .execute(&mut admin)
        .await
        .expect("create a sync");
    }
    let head = "SELECT generation::bigint * 1000 + head_epoch FROM orca.syncs WHERE name = 'shop'";
    // An operator (runner rights included) cannot fence or move it by hand.
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    db.pool
        .execute(format!("GRANT orca_attempt TO {OPERATOR}").as_str())
        .await
        .expect("grant");
    for sql in [
        "SELECT orca.claim_sync('shop')",
        "SELECT orca.advance_head('shop', 1, 1, 'acme/shop/_checkpoints/x.json')",
        "SELECT orca.rewind_head('shop', 1, 0, NULL)",
    ] {
        assert_eq!(code_of(&mut op, sql).await, "OR084", "{sql}");
    }
    // With the lease of the sync's own run only.
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&mut admin)
        .await
        .expect("run the sync");
    let acme = token(&db, "acme", "default", "host-a").await;
    let mut r = runner_session(&db, &acme).await;
    let leases: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT lease, run FROM orca.claim('host-a', 'default', 100, ARRAY['sync'])",
    )
    .fetch_all(&mut r)
    .await
    .expect("claim the sync's attempt");
    let lease = leases
        .iter()
        .find(|(_, id)| *id == run)
        .map(|(l, _)| *l)
        .expect("the sync's attempt");
    assert_eq!(
        code_of(
            &mut op,
            &format!("SELECT orca.claim_sync('other', '{lease}')")
        )
        .await,
        "OR084"
    );
    let claimed: Value = sqlx::query_scalar("SELECT orca.claim_sync('shop', $1)")
        .bind(lease)
        .fetch_one(&mut op)
        .await
        .expect("claim with the lease");
    let generation = claimed["generation"].as_i64().unwrap_or_default();
    let before = db.scalar_i64(head).await;
    // Records name the sync's own checkpoints, nothing else.
    for record in [
        "acme/other/_checkpoints/0000000001-g1.json",
        "globex/shop/_checkpoints/0000000001-g1.json",
        "acme/shop/_checkpoints/../../../globex/shop/_checkpoints/x.json",
        "acme/shop/_checkpoints/sub/x.json",
        "/etc/passwd",
        "acme/shop/_staging/x.json",
    ] {
        let (code, msg) = expect_error(
            &mut op,
            &format!("SELECT orca.advance_head('shop', {generation}, 1, '{record}', '{lease}')"),
        )
        .await;
        assert_eq!(code, "OR085", "{record}: {msg}");
        assert!(msg.contains(record), "{msg}");
    }
    assert_eq!(db.scalar_i64(head).await, before, "HEAD did not move");
    op.execute(
        format!(
            "SELECT orca.advance_head('shop', {generation}, 1, \
             'acme/shop/_checkpoints/0000000001-g{generation}.json', '{lease}')"
        )
        .as_str(),
    )
    .await
    .expect("its own record, under its lease");
    // Once the attempt has ended, its lease moves nothing.
    r.execute(format!("SELECT orca.finish('{lease}', true)").as_str())
        .await
        .expect("finish");
    assert_eq!(
        code_of(
            &mut op,
            &format!(
                "SELECT orca.advance_head('shop', {generation}, 2, \
                 'acme/shop/_checkpoints/0000000002-g{generation}.json', '{lease}')"
            )
        )
        .await,
        "OR014"
    );
}
