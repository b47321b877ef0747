//! `#[orca::step(...)]`.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use sha2::{Digest, Sha256};
use syn::{FnArg, GenericArgument, ItemFn, Path, PathArguments, ReturnType, Type};

use crate::{step_type_ident, step_type_path};

struct StepArgs {
    kind: Option<(String, proc_macro2::Span)>,
    after: Option<Path>,
    retries: u32,
    reads: Vec<syn::LitStr>,
    writes: Vec<syn::LitStr>,
}

/// `["ns.table", ...]`, each checked to be a dataset name.
fn datasets(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Vec<syn::LitStr>> {
    let value = meta.value()?;
    let content;
    syn::bracketed!(content in value);
    let list: syn::punctuated::Punctuated<syn::LitStr, syn::Token![,]> =
        content.parse_terminated(|p| p.parse::<syn::LitStr>(), syn::Token![,])?;
    for d in &list {
        let v = d.value();
        let ok_part = |p: &str| {
            !p.is_empty()
                && p.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !matches!(v.split_once('.'), Some((ns, t)) if ok_part(ns) && ok_part(t)) {
            return Err(syn::Error::new(
                d.span(),
                format!("\"{v}\" is not a dataset: write namespace.table in lowercase"),
            ));
        }
    }
    Ok(list.into_iter().collect())
}

fn parse_args(attr: TokenStream) -> syn::Result<StepArgs> {
    let mut args = StepArgs {
        kind: None,
        after: None,
        retries: 0,
        reads: Vec::new(),
        writes: Vec::new(),
    };
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("mapped") || meta.path.is_ident("gather") {
            if args.kind.is_some() {
                return Err(meta.error("a step is either `mapped` or `gather`, not both"));
            }
            let kind = if meta.path.is_ident("mapped") {
                "mapped"
            } else {
                "gather"
            };
            args.kind = Some((kind.to_string(), meta.path.segments[0].ident.span()));
            Ok(())
        } else if meta.path.is_ident("after") {
            args.after = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("reads") {
            args.reads = datasets(&meta)?;
            Ok(())
        } else if meta.path.is_ident("writes") {
            args.writes = datasets(&meta)?;
            Ok(())
        } else if meta.path.is_ident("retries") {
            let lit: syn::LitInt = meta.value()?.parse()?;
            args.retries = lit.base10_parse()?;
            if args.retries > 100 {
                return Err(syn::Error::new(lit.span(), "retries must be from 0 to 100"));
            }
            Ok(())
        } else {
            Err(meta.error(
                "unknown step option: use `mapped` or `gather`, `after = <step>`, `retries = <n>`, `reads = [..]`, `writes = [..]`",
            ))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok(args)
}

/// `Result<T>` / `orca::Result<T>` / `Result<T, E>`: the `T`. `what` is
/// "a step" or "a task", for the error.
pub(crate) fn output_type(ret: &ReturnType, what: &str) -> syn::Result<Type> {
    let err = || {
        syn::Error::new_spanned(
            ret,
            format!("{what} returns `orca::Result<Output>` (or any `Result<Output, E>`)"),
        )
    };
    let ReturnType::Type(_, ty) = ret else {
        return Err(err());
    };
    let Type::Path(tp) = ty.as_ref() else {
        return Err(err());
    };
    let last = tp.path.segments.last().ok_or_else(err)?;
    if last.ident != "Result" {
        return Err(err());
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return Err(err());
    };
    match args.args.first() {
        Some(GenericArgument::Type(t)) => Ok(t.clone()),
        _ => Err(err()),
    }
}

pub fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = parse_args(attr)?;
    let func: ItemFn = syn::parse2(item)?;
    let Some((kind, kind_span)) = args.kind.clone() else {
        return Err(syn::Error::new_spanned(
            &func.sig.ident,
            "say what kind of step this is: #[orca::step(mapped)] or #[orca::step(gather)]",
        ));
    };
    let name = &func.sig.ident;
    let inputs: Vec<&FnArg> = func.sig.inputs.iter().collect();
    if inputs.len() != 2 {
        return Err(syn::Error::new_spanned(
            &func.sig,
            "a step takes two arguments: `ctx: &mut orca::Ctx` and its input",
        ));
    }
    let input_ty = match inputs[1] {
        FnArg::Typed(pt) => (*pt.ty).clone(),
        FnArg::Receiver(r) => {
            return Err(syn::Error::new_spanned(
                r,
                "a step is a free function, not a method",
            ))
        }
    };
    let output_ty = output_type(&func.sig.output, "a step")?;
    let vis = &func.vis;
    let ty = step_type_ident(name);
    let kind_ty = if kind == "mapped" {
        quote::quote_spanned!(kind_span=> ::orca::Mapped)
    } else {
        quote::quote_spanned!(kind_span=> ::orca::Gather)
    };
    let (after_ty, after_id) = match &args.after {
        Some(p) => {
            let t = step_type_path(p);
            (
                quote!(#t),
                quote!(::core::option::Option::Some(<#t as ::orca::Step>::ID)),
            )
        }
        None => (
            quote!(::orca::Previous),
            quote!(::core::option::Option::None),
        ),
    };
    // The code hash: the function's tokens (signature and body), its kind,
    // the step it follows and its retries. Comments and formatting are not
    // tokens, so they do not change it; neither does the commit it is built at.
    let mut h = Sha256::new();
    h.update(func.to_token_stream().to_string().as_bytes());
    h.update(kind.as_bytes());
    h.update(
        args.after
            .as_ref()
            .map(|p| p.to_token_stream().to_string())
            .unwrap_or_default()
            .as_bytes(),
    );
    h.update(args.retries.to_le_bytes());
    for d in args.reads.iter().chain(&args.writes) {
        h.update(d.value().as_bytes());
    }
    let code: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let retries = args.retries;
    let name_str = name.to_string();
    let reads = &args.reads;
    let writes = &args.writes;

    Ok(quote! {
        #func

        #[doc(hidden)]
        #[allow(non_camel_case_types)]
        #vis struct #ty;

        impl ::orca::Step for #ty {
            type Input = #input_ty;
            type Output = #output_ty;
            type Kind = #kind_ty;
            type After = #after_ty;
            const NAME: &'static str = #name_str;
            const ID: &'static str = ::core::concat!(::core::module_path!(), "::", #name_str);
            const AFTER_ID: ::core::option::Option<&'static str> = #after_id;
            const RETRIES: u32 = #retries;
            const CODE: &'static str = #code;
            const READS: &'static [&'static str] = &[#(#reads),*];
            const WRITES: &'static [&'static str] = &[#(#writes),*];
            fn call(ctx: &mut ::orca::Ctx<'_>, input: Self::Input) -> ::orca::Result<Self::Output> {
                #name(ctx, input).map_err(::core::convert::Into::into)
            }
        }

        impl<D> ::orca::AfterOr<D> for #ty {
            type Prev = #ty;
        }
    })
}
