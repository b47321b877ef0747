//! The compile-time rules of a pipeline. `orca::pipeline!` turns each edge
//! into a call of [`first`] or [`edge`], whose trait bounds fail to hold when a
//! rule is broken; the compiler then prints the rule's own message.

use crate::step::{Gather, Mapped, Step};

/// Rule 1: a first mapped step takes the partition key, a first gather step a
/// `Vec` of it.
#[diagnostic::on_unimplemented(
    message = "the first step must take the partition key: a first mapped step takes `{Key}`, a first gather step `Vec<{Key}>`, but this {Kind} step takes `{Self}`",
    label = "the first step's input does not fit the pipeline's partitions"
)]
pub trait FirstInput<Kind, Key> {}
impl<K> FirstInput<Mapped, K> for K {}
impl<K> FirstInput<Gather, K> for Vec<K> {}

/// Rule 2, part one: a mapped step cannot follow a gather step.
#[diagnostic::on_unimplemented(
    message = "a mapped step cannot follow a gather step: a gather step's single output has no partitions to map over",
    label = "this mapped step follows a gather step"
)]
pub trait CanFollow<PrevKind> {}
impl CanFollow<Mapped> for Mapped {}
impl<P> CanFollow<P> for Gather {}

/// Rule 2, part two: a mapped step takes the output of the mapped step it follows.
#[diagnostic::on_unimplemented(
    message = "a mapped step takes the output of the mapped step it follows: it takes `{Self}`, but that step returns `{PrevOut}`",
    label = "input does not match the previous step's output"
)]
pub trait MappedInput<NextKind, PrevKind, PrevOut> {}
impl<T> MappedInput<Mapped, Mapped, T> for T {}
impl<PO, I> MappedInput<Mapped, Gather, PO> for I {}
impl<PK, PO, I> MappedInput<Gather, PK, PO> for I {}

/// Rule 3: a gather step after a mapped step takes a `Vec` of its output; after
/// a gather step, its output.
#[diagnostic::on_unimplemented(
    message = "a gather step takes a Vec of the output of the mapped step it follows, or the output of the gather step it follows: it takes `{Self}`, but that {PrevKind} step returns `{PrevOut}`",
    label = "input does not match the previous step's output"
)]
pub trait GatherInput<NextKind, PrevKind, PrevOut> {}
impl<T> GatherInput<Gather, Mapped, T> for Vec<T> {}
impl<T> GatherInput<Gather, Gather, T> for T {}
impl<PK, PO, I> GatherInput<Mapped, PK, PO> for I {}

/// Checks the first step of a pipeline whose partition key is `K`.
pub fn first<K, S: Step>()
where
    S::Input: FirstInput<S::Kind, K>,
{
}

/// Checks the edge from step `P` to the step `N` that follows it.
pub fn edge<P: Step, N: Step>()
where
    N::Kind: CanFollow<P::Kind>,
    N::Input: MappedInput<N::Kind, P::Kind, P::Output>,
    N::Input: GatherInput<N::Kind, P::Kind, P::Output>,
{
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Rule 4 and 5: a step's `after` names one of the pipeline's steps listed
/// before it, compared by function.
pub const fn after_listed(before: &[&str], after: Option<&str>) -> bool {
    let Some(after) = after else {
        return true;
    };
    let mut i = 0;
    while i < before.len() {
        if same(before[i], after) {
            return true;
        }
        i += 1;
    }
    false
}
