//! Macros of the Orca SDK. `#[orca::step]` turns a function into a step type
//! the compiler can reason about; `orca::pipeline!` lists steps and makes the
//! compiler check every edge between them (see `orca::check`).

use proc_macro::TokenStream;

mod pipeline;
mod step;
mod task;

/// Declares a step: `#[orca::step(mapped)]`, `#[orca::step(gather, after = measure, retries = 2)]`.
///
/// The function keeps its name and stays callable; the macro adds a hidden
/// type that implements `orca::Step` with the function's input and output
/// types, the kind, the step it follows, its retries and a hash of its code.
#[proc_macro_attribute]
pub fn step(attr: TokenStream, item: TokenStream) -> TokenStream {
    step::expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Declares a task: `#[orca::task(Trips)]`, `#[orca::task(Trips, retries = 2, backoff_ms = 500)]`.
///
/// The function (`fn(Input) -> Result<Output>`) keeps its name; the macro
/// adds the type named first, which implements `orca::Task`: what a step's
/// runtime submits (`rt.remote::<Trips>(input)`) and a task set lists
/// (`orca::tasks!(FanoutTasks = [Trips])`). A failed task is tried again
/// `retries` times (default 3), the first retry after `backoff_ms` (default
/// 1000), each later one after twice the wait before it.
#[proc_macro_attribute]
pub fn task(attr: TokenStream, item: TokenStream) -> TokenStream {
    task::expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Declares a pipeline: its name, its steps in run order and its parameters.
///
/// ```ignore
/// orca::pipeline! {
///     Lake = "lake" [days, measure, total],
///     partitions = Monthly("2024-01"),
///     schedule = Cron("0 3 2 * *"),
///     fills = Previous,
///     max_runs = 2,
///     run_retries = 3,
///     tasks = FanoutTasks,
/// }
/// ```
#[proc_macro]
pub fn pipeline(input: TokenStream) -> TokenStream {
    pipeline::expand(input.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// The name of the hidden type `#[orca::step]` makes for a function.
pub(crate) fn step_type_ident(f: &syn::Ident) -> syn::Ident {
    syn::Ident::new(&format!("__OrcaStep_{f}"), f.span())
}

/// The same path, with its last segment turned into the step type's name.
pub(crate) fn step_type_path(p: &syn::Path) -> syn::Path {
    let mut p = p.clone();
    if let Some(last) = p.segments.last_mut() {
        last.ident = step_type_ident(&last.ident);
    }
    p
}
