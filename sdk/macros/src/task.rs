//! `#[orca::task(Name, retries = 3, backoff_ms = 1000)]`.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use sha2::{Digest, Sha256};
use syn::{FnArg, Ident, ItemFn};

use crate::step::output_type;

struct TaskArgs {
    ty: Ident,
    retries: u32,
    backoff_ms: u32,
}

fn parse_args(attr: TokenStream, func: &ItemFn) -> syn::Result<TaskArgs> {
    let mut ty: Option<Ident> = None;
    let mut retries = 3u32;
    let mut backoff_ms = 1000u32;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("retries") {
            let lit: syn::LitInt = meta.value()?.parse()?;
            retries = lit.base10_parse()?;
            if retries > 100 {
                return Err(syn::Error::new(lit.span(), "retries must be from 0 to 100"));
            }
            Ok(())
        } else if meta.path.is_ident("backoff_ms") {
            let lit: syn::LitInt = meta.value()?.parse()?;
            backoff_ms = lit.base10_parse()?;
            if backoff_ms > 3_600_000 {
                return Err(syn::Error::new(
                    lit.span(),
                    "backoff_ms must be from 0 to 3600000 (an hour)",
                ));
            }
            Ok(())
        } else if let (Some(id), None, true) = (
            meta.path.get_ident(),
            &ty,
            meta.input.is_empty() || meta.input.peek(syn::Token![,]),
        ) {
            ty = Some(id.clone());
            Ok(())
        } else {
            Err(meta.error(
                "unknown task option: name the task's type first, then `retries = <n>`, `backoff_ms = <n>`",
            ))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    let ty = ty.ok_or_else(|| {
        syn::Error::new_spanned(
            &func.sig.ident,
            "name the type the task is known by: #[orca::task(Trips)]",
        )
    })?;
    Ok(TaskArgs {
        ty,
        retries,
        backoff_ms,
    })
}

pub fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let func: ItemFn = syn::parse2(item)?;
    let args = parse_args(attr, &func)?;
    let name = &func.sig.ident;
    let inputs: Vec<&FnArg> = func.sig.inputs.iter().collect();
    let input_ty = match inputs.as_slice() {
        [FnArg::Typed(pt)] => (*pt.ty).clone(),
        [FnArg::Receiver(r)] => {
            return Err(syn::Error::new_spanned(
                r,
                "a task is a free function, not a method",
            ))
        }
        _ => {
            return Err(syn::Error::new_spanned(
                &func.sig,
                "a task takes one argument, its input: fn trips(day: Day) -> orca::Result<i64>",
            ))
        }
    };
    let output_ty = output_type(&func.sig.output, "a task")?;
    let vis = &func.vis;
    let ty = &args.ty;
    let retries = args.retries;
    let backoff_ms = args.backoff_ms;
    // The code hash: the function's tokens, its retries and its backoff.
    let mut h = Sha256::new();
    h.update(func.to_token_stream().to_string().as_bytes());
    h.update(retries.to_le_bytes());
    h.update(backoff_ms.to_le_bytes());
    let code: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name_str = name.to_string();
    Ok(quote! {
        #func

        /// The task of the function of the same name (`#[orca::task]`).
        #vis struct #ty;

        impl ::orca::Task for #ty {
            type Input = #input_ty;
            type Output = #output_ty;
            const NAME: &'static str = #name_str;
            const CODE: &'static str = #code;
            const RETRIES: u32 = #retries;
            const BACKOFF_MS: u32 = #backoff_ms;
            fn call(input: Self::Input) -> ::orca::Result<Self::Output> {
                #name(input).map_err(::core::convert::Into::into)
            }
        }
    })
}
