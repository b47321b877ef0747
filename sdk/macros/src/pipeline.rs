//! `orca::pipeline! { Name = "name" [steps...], params... }`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{bracketed, Expr, ExprCall, ExprLit, Ident, Lit, LitStr, Path, Token};

use crate::step_type_path;

struct Input {
    ident: Ident,
    name: LitStr,
    steps: Vec<Path>,
    params: Vec<(Ident, Expr)>,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let ident: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        let name: LitStr = input.parse()?;
        let content;
        bracketed!(content in input);
        let steps: Punctuated<Path, Token![,]> =
            content.parse_terminated(Path::parse, Token![,])?;
        let mut params = Vec::new();
        while input.peek(Token![,]) {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse()?;
            params.push((key, value));
        }
        if !input.is_empty() {
            return Err(input.error("expected `, name = value` after the steps"));
        }
        Ok(Input {
            ident,
            name,
            steps: steps.into_iter().collect(),
            params,
        })
    }
}

fn lit_str(e: &Expr, what: &str) -> syn::Result<LitStr> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.clone()),
        _ => Err(syn::Error::new_spanned(
            e,
            format!("{what} must be a string literal"),
        )),
    }
}

/// `Monthly("2024-01")` -> ("Monthly", ["2024-01"]).
fn call(e: &Expr, what: &str) -> syn::Result<(Ident, Vec<LitStr>)> {
    let Expr::Call(ExprCall { func, args, .. }) = e else {
        return Err(syn::Error::new_spanned(
            e,
            format!("{what}: expected a call such as Monthly(\"2024-01\")"),
        ));
    };
    let Expr::Path(p) = func.as_ref() else {
        return Err(syn::Error::new_spanned(
            func,
            format!("{what}: expected a name"),
        ));
    };
    let id = p
        .path
        .segments
        .last()
        .map(|s| s.ident.clone())
        .ok_or_else(|| syn::Error::new_spanned(func, "expected a name"))?;
    let args = args
        .iter()
        .map(|a| lit_str(a, what))
        .collect::<syn::Result<_>>()?;
    Ok((id, args))
}

pub fn expand(input: TokenStream) -> syn::Result<TokenStream> {
    let Input {
        ident,
        name,
        steps,
        params,
    } = syn::parse2(input)?;
    if steps.is_empty() {
        return Err(syn::Error::new_spanned(
            &ident,
            "a pipeline needs at least one step",
        ));
    }
    // Rule: unique step names (a step's name is its function's name).
    for (i, a) in steps.iter().enumerate() {
        let an = a.segments.last().map(|s| s.ident.to_string());
        for b in &steps[..i] {
            if b.segments.last().map(|s| s.ident.to_string()) == an {
                return Err(syn::Error::new_spanned(
                    a,
                    format!(
                        "step names must be unique: `{}` is listed twice",
                        an.unwrap_or_default()
                    ),
                ));
            }
        }
    }

    let mut key_ty = None;
    let mut partitions = None;
    let mut schedule = quote!(::core::option::Option::None);
    let mut fills = quote!(::orca::Fills::Previous);
    let mut max_runs = quote!(::core::option::Option::None);
    let mut run_retries = quote!(0);
    let mut catchup = quote!(true);
    let mut pool = quote!("default");
    let mut cpu = quote!(::core::option::Option::None);
    let mut memory = quote!(::core::option::Option::None);
    let mut max_memory = quote!(::core::option::Option::None);
    let mut memory_growth = quote!(::core::option::Option::None);
    let mut sensor = quote!(false);
    let mut keys_per_run = quote!(::core::option::Option::None);
    let mut backfill_per_run = quote!(::core::option::Option::None);
    let mut tasks = quote!(::std::vec::Vec::new());
    let mut keyed = false;
    let mut dated_only: Vec<&Ident> = Vec::new();
    for (key, value) in &params {
        match key.to_string().as_str() {
            "partitions" => {
                let (kind, args) = call(value, "partitions")?;
                if kind == "Keyed" {
                    let [dataset, column] = args.as_slice() else {
                        return Err(syn::Error::new_spanned(value, "give the dataset and the column the keys come from: Keyed(\"lake.raw\", \"origin\")"));
                    };
                    key_ty = Some(quote!(::orca::Name));
                    partitions = Some(quote!(::orca::Partitioning::Keyed { dataset: #dataset, column: #column }));
                    keyed = true;
                    continue;
                }
                let (ty, kind_name) = match kind.to_string().as_str() {
                    "Monthly" => (quote!(::orca::Month), "monthly"),
                    "Daily" => (quote!(::orca::Day), "daily"),
                    _ => {
                        return Err(syn::Error::new_spanned(
                            kind,
                            "partitions are Monthly(\"YYYY-MM\"), Daily(\"YYYY-MM-DD\") or Keyed(\"namespace.table\", \"column\")",
                        ))
                    }
                };
                let [start] = args.as_slice() else {
                    return Err(syn::Error::new_spanned(value, "give the first partition: Monthly(\"2024-01\")"));
                };
                key_ty = Some(ty);
                partitions = Some(quote!(::orca::Partitioning::Dated { kind: #kind_name, start: #start }));
            }
            "schedule" => {
                dated_only.push(key);
                let (kind, args) = call(value, "schedule")?;
                if kind != "Cron" {
                    return Err(syn::Error::new_spanned(kind, "a schedule is Cron(\"...\") or Cron(\"...\", \"Area/City\")"));
                }
                schedule = match args.as_slice() {
                    [expr] => quote!(::core::option::Option::Some((#expr, "UTC"))),
                    [expr, tz] => quote!(::core::option::Option::Some((#expr, #tz))),
                    _ => return Err(syn::Error::new_spanned(value, "Cron takes an expression and an optional time zone")),
                };
            }
            "fills" => {
                dated_only.push(key);
                let Expr::Path(p) = value else {
                    return Err(syn::Error::new_spanned(value, "fills is Previous or Current"));
                };
                let last = p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
                let v = format_ident!("{}", last);
                if last != "Previous" && last != "Current" {
                    return Err(syn::Error::new_spanned(value, "fills is Previous or Current"));
                }
                fills = quote!(::orca::Fills::#v);
            }
            "max_runs" => max_runs = quote!(::core::option::Option::Some(#value)),
            "run_retries" => run_retries = quote!(#value),
            "catchup" => catchup = quote!(#value),
            "sensor" => sensor = quote!(#value),
            "keys_per_run" => keys_per_run = quote!(::core::option::Option::Some(#value)),
            "backfill_per_run" => {
                dated_only.push(key);
                backfill_per_run = quote!(::core::option::Option::Some(#value));
            }
            // A task set (`tasks = FanoutTasks`) or a list of tasks
            // (`tasks = [Trips, Weigh]`).
            "tasks" => {
                tasks = match value {
                    Expr::Array(list) => {
                        let items = list.elems.iter();
                        quote!(::std::vec![#(::orca::TaskInfo::of::<#items>()),*])
                    }
                    Expr::Path(set) => quote!(<#set as ::orca::TaskSet>::tasks()),
                    _ => {
                        return Err(syn::Error::new_spanned(
                            value,
                            "tasks is a task set (tasks = FanoutTasks, from orca::tasks!) or a list of tasks (tasks = [Trips, Weigh])",
                        ))
                    }
                };
            }
            "pool" => {
                let s = lit_str(value, "pool")?;
                pool = quote!(#s);
            }
            "cpu" => {
                let s = lit_str(value, "cpu")?;
                cpu = quote!(::core::option::Option::Some(#s));
            }
            "memory" => {
                let s = lit_str(value, "memory")?;
                memory = quote!(::core::option::Option::Some(#s));
            }
            "max_memory" => {
                let s = lit_str(value, "max_memory")?;
                max_memory = quote!(::core::option::Option::Some(#s));
            }
            "memory_growth" => memory_growth = quote!(::core::option::Option::Some(#value)),
            other => {
                return Err(syn::Error::new_spanned(
                    key,
                    format!(
                        "unknown pipeline parameter `{other}`: use partitions, schedule, fills, max_runs, run_retries, catchup, pool, sensor, keys_per_run, backfill_per_run, tasks, cpu, memory, max_memory or memory_growth"
                    ),
                ))
            }
        }
    }
    let (Some(key_ty), Some(partitions)) = (key_ty, partitions) else {
        return Err(syn::Error::new_spanned(
            &ident,
            "a pipeline needs `partitions = Monthly(\"YYYY-MM\")`, `Daily(\"YYYY-MM-DD\")` or `Keyed(\"namespace.table\", \"column\")`",
        ));
    };
    if keyed {
        if let Some(key) = dated_only.first() {
            return Err(syn::Error::new_spanned(
                key,
                format!("a keyed pipeline has no `{key}`: it runs by hand, by backfill or as a sensor, and its partitions are keys, not months or days"),
            ));
        }
    } else if let Some((key, _)) = params.iter().find(|(k, _)| k == "keys_per_run") {
        return Err(syn::Error::new_spanned(
            key,
            "`keys_per_run` is for a keyed pipeline: partitions = Keyed(\"namespace.table\", \"column\")",
        ));
    }

    let tys: Vec<Path> = steps.iter().map(step_type_path).collect();
    let pipeline_name = name.value();
    let step_names: Vec<String> = steps
        .iter()
        .map(|p| {
            p.segments
                .last()
                .map(|s| s.ident.to_string())
                .unwrap_or_default()
        })
        .collect();

    let mut infos = Vec::new();
    let mut edges = Vec::new();
    let mut asserts = Vec::new();
    for (i, ty) in tys.iter().enumerate() {
        let sname = &step_names[i];
        if i == 0 {
            infos.push(quote!(::orca::StepInfo::of::<#ty>(::core::option::Option::None)));
            edges.push(quote!(::orca::check::first::<#key_ty, #ty>();));
            let msg = format!(
                "pipeline `{pipeline_name}`: its first step `{sname}` cannot follow another step"
            );
            asserts.push(quote!(::core::assert!(<#ty as ::orca::Step>::AFTER_ID.is_none(), #msg);));
        } else {
            let listed = &tys[i - 1];
            let prev = quote!(<<#ty as ::orca::Step>::After as ::orca::AfterOr<#listed>>::Prev);
            infos.push(quote!(::orca::StepInfo::of::<#ty>(
                ::core::option::Option::Some(<#prev as ::orca::Step>::NAME)
            )));
            edges.push(quote!(::orca::check::edge::<#prev, #ty>();));
            let before = &tys[..i];
            let msg = format!(
                "pipeline `{pipeline_name}`: step `{sname}` follows a step that is not one of this pipeline's steps listed before it"
            );
            asserts.push(quote!(::core::assert!(
                ::orca::check::after_listed(&[#(<#before as ::orca::Step>::ID),*], <#ty as ::orca::Step>::AFTER_ID),
                #msg
            );));
        }
    }
    let check_fn = format_ident!("__orca_check_{}", ident);

    Ok(quote! {
        pub struct #ident;

        impl ::orca::Pipeline for #ident {
            type Key = #key_ty;
            const NAME: &'static str = #name;
            fn params() -> ::orca::Params {
                ::orca::Params {
                    partitions: #partitions,
                    schedule: #schedule,
                    fills: #fills,
                    max_runs: #max_runs,
                    run_retries: #run_retries,
                    catchup: #catchup,
                    pool: #pool,
                    sensor: #sensor,
                    keys_per_run: #keys_per_run,
                    backfill_per_run: #backfill_per_run,
                    resources: ::orca::Resources {
                        cpu: #cpu,
                        memory: #memory,
                        max_memory: #max_memory,
                        memory_growth: #memory_growth,
                    },
                    build: ::orca::Build {
                        source: ::core::option_env!("ORCA_SOURCE"),
                        commit: ::core::option_env!("ORCA_COMMIT"),
                        dirty: ::core::option_env!("ORCA_DIRTY"),
                        image: ::core::option_env!("ORCA_IMAGE"),
                    },
                }
            }
            fn steps() -> ::std::vec::Vec<::orca::StepInfo> {
                ::std::vec![#(#infos),*]
            }
            fn tasks() -> ::std::vec::Vec<::orca::TaskInfo> {
                #tasks
            }
        }

        // Each edge is a trait bound: a broken rule is a compile error that names it.
        #[allow(dead_code, non_snake_case)]
        fn #check_fn() {
            #(#edges)*
        }

        const _: () = {
            #(#asserts)*
        };
    })
}
