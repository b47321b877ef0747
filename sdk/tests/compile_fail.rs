//! One pipeline per edge rule, each pinned to fail to compile with the rule's
//! own message (`TRYBUILD=overwrite cargo test -p orca --test compile_fail`
//! rewrites the expected output after a deliberate change).

#[test]
fn every_broken_edge_rule_fails_to_compile_with_its_message() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
