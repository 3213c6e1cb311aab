//! The annotated function as a typed handler: its parameters recognised by their types, its
//! return type taken apart, the attribute's options beside them. Nothing here judges: the rules
//! are in `check/`.

mod func;
mod pat;
mod ty;
mod uses;

use proc_macro2::TokenStream;
use syn::{Expr, FnArg, Ident, PatType, Receiver, ReturnType, Type, TypeReference};

use crate::attr::{Args, ModeArg};
use crate::ctxt::Ctxt;

pub(crate) use func::{Func, first_self_type};
use pat::bindings;
pub(crate) use pat::by_reference;
pub(crate) use ty::{borrows, contains_impl_trait, is_report_type, vec_element};
use ty::{last_ident, result_types};
pub(crate) use uses::{Uses, macro_args};

/// What a parameter is to the runtime, recognised by its type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `&DatabaseTransaction`.
    Transaction,
    /// `&Metadata`.
    Metadata,
    /// `&Context<'_>`.
    Context,
    /// `&Outbound<'_>`: what the run stages and passes downstream.
    Outbound,
    /// `&SliceContext<'_>`: a slice handler's messages' contexts.
    SliceContext,
    /// Any other type: the message (a slice handler's messages, `Vec<M>`).
    Message,
}

impl Role {
    /// What the parameter is called in messages: "transaction", "metadata", "context".
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Role::Transaction => "transaction",
            Role::Metadata => "metadata",
            Role::Context => "context",
            Role::Outbound => "outbound",
            Role::SliceContext => "slice context",
            Role::Message => "message",
        }
    }

    /// The type's name: `DatabaseTransaction`, `Metadata`, `Context`.
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Role::Transaction => "DatabaseTransaction",
            Role::Metadata => "Metadata",
            Role::Context => "Context",
            Role::Outbound => "Outbound",
            Role::SliceContext => "SliceContext",
            Role::Message => "the message type",
        }
    }
}

/// One parameter, other than `self`.
pub(crate) struct Param<'a> {
    pub(crate) arg: &'a PatType,
    pub(crate) role: Role,
    /// The `&` or `&mut` of its type, when it has one.
    pub(crate) reference: Option<&'a TypeReference>,
}

impl Param<'_> {
    /// The names its pattern binds.
    pub(crate) fn bindings(&self) -> Vec<Ident> {
        bindings(&self.arg.pat)
    }
}

/// The return type taken apart.
pub(crate) struct Output<'a> {
    /// `None` without `-> ...`.
    pub(crate) ty: Option<&'a Type>,
    /// The `T` of a `Result<T, ..>` written out.
    pub(crate) ok: Option<&'a Type>,
    /// The `E` of a `Result<T, E>` written out; `None` for an alias with a default error
    /// (`anyhow::Result<T>`).
    pub(crate) err: Option<&'a Type>,
}

/// The typed handler.
pub(crate) struct Handler<'a> {
    pub(crate) func: &'a Func,
    pub(crate) receiver: Option<&'a Receiver>,
    /// The parameters after `self`, in order.
    pub(crate) params: Vec<Param<'a>>,
    pub(crate) output: Output<'a>,
    /// The attribute's options.
    pub(crate) args: Args,
}

impl<'a> Handler<'a> {
    /// The handler of `func` with the attribute's tokens `attr`; `None` when they do not parse
    /// (the error is in `cx`).
    pub(crate) fn from_syn(cx: &Ctxt, attr: TokenStream, func: &'a Func) -> Option<Self> {
        let args: Args = match syn::parse2(attr) {
            Ok(args) => args,
            Err(error) => {
                cx.syn_error(error);
                return None;
            }
        };
        let (receiver, params) = params(func);
        Some(Handler {
            func,
            receiver,
            params,
            output: Output::from_syn(&func.sig.output),
            args,
        })
    }

    /// Whether the function handles a slice of messages at once.
    pub(crate) fn is_slice(&self) -> bool {
        self.args.slice.is_some()
    }

    /// The type of one message: the message parameter's, or its element for a slice handler
    /// (`None` when a slice handler's is not a `Vec`).
    pub(crate) fn message_type(&self) -> Option<&'a Type> {
        let ty = &*self.param(Role::Message)?.arg.ty;
        if self.is_slice() {
            vec_element(ty)
        } else {
            Some(ty)
        }
    }

    /// The type of one output: the `Ok` type, or its element for a slice handler.
    pub(crate) fn output_type(&self) -> Option<&'a Type> {
        let ok = self.output.ok?;
        if self.is_slice() {
            vec_element(ok)
        } else {
            Some(ok)
        }
    }

    /// The names an option's expression may read one message by: the message parameter's
    /// bindings, or for a slice handler the first name it reads that no parameter binds (one
    /// message of the slice, `order` in `key = order.id`), other than a function it calls or a
    /// name it uses as metadata.
    pub(crate) fn message_names(&self, expr: &Expr) -> Vec<Ident> {
        if !self.is_slice() {
            return self
                .param(Role::Message)
                .map(|param| param.bindings())
                .unwrap_or_default();
        }
        let bound: Vec<Ident> = self.params.iter().flat_map(|p| p.bindings()).collect();
        let uses = Uses::of(expr);
        // Not a message: a name starting with a capital (a constant or a unit struct), a
        // function called, a name used as the transport's metadata.
        let message = |var: &Ident| {
            !var.to_string().starts_with(char::is_uppercase)
                && !uses.called.contains(var)
                && !uses.metadata_like.contains(var)
        };
        uses.vars
            .iter()
            .find(|var| !bound.contains(var) && message(var))
            .cloned()
            .into_iter()
            .collect()
    }

    pub(crate) fn ident(&self) -> &'a Ident {
        &self.func.sig.ident
    }

    /// Whether the function takes `self` in some form.
    pub(crate) fn is_method(&self) -> bool {
        self.receiver.is_some()
    }

    /// The names bound by the parameters with one of `roles`, in order.
    pub(crate) fn names_bound_by(&self, roles: &[Role]) -> Vec<Ident> {
        self.params
            .iter()
            .filter(|param| roles.contains(&param.role))
            .flat_map(|param| param.bindings())
            .collect()
    }

    /// The first parameter with `role`.
    pub(crate) fn param(&self, role: Role) -> Option<&Param<'a>> {
        self.params.iter().find(|param| param.role == role)
    }

    /// Whether the handler runs in a transaction: it takes one, or its mode says so
    /// (`transactional`, `entity`, `natural`).
    pub(crate) fn is_transactional(&self) -> bool {
        match self.args.mode {
            // A slice shares the batch's transaction.
            None if self.is_slice() => true,
            // Entity and natural runs have a transaction of their own.
            Some((ModeArg::Transactional | ModeArg::Entity | ModeArg::Natural, _)) => true,
            Some((ModeArg::TwoPhase, _)) => false,
            None => self.param(Role::Transaction).is_some(),
        }
    }
}

/// The function's `self`, if any, and its other parameters.
pub(crate) fn params(func: &Func) -> (Option<&Receiver>, Vec<Param<'_>>) {
    let mut receiver = None;
    let mut params = Vec::new();
    for input in &func.sig.inputs {
        match input {
            FnArg::Receiver(r) => receiver = Some(r),
            FnArg::Typed(arg) => params.push(Param::from_syn(arg)),
        }
    }
    (receiver, params)
}

impl<'a> Param<'a> {
    fn from_syn(arg: &'a PatType) -> Self {
        let (reference, target) = match &*arg.ty {
            Type::Reference(reference) => (Some(reference), &*reference.elem),
            other => (None, other),
        };
        let role = match last_ident(target) {
            Some(name) if name == "DatabaseTransaction" => Role::Transaction,
            Some(name) if name == "Metadata" => Role::Metadata,
            Some(name) if name == "Context" => Role::Context,
            Some(name) if name == "Outbound" => Role::Outbound,
            Some(name) if name == "SliceContext" => Role::SliceContext,
            _ => Role::Message,
        };
        Param {
            arg,
            role,
            reference,
        }
    }
}

impl<'a> Output<'a> {
    pub(crate) fn from_syn(output: &'a ReturnType) -> Self {
        match output {
            ReturnType::Type(_, ty) => Self::from_type(ty),
            ReturnType::Default => Output {
                ty: None,
                ok: None,
                err: None,
            },
        }
    }

    pub(crate) fn from_type(ty: &'a Type) -> Self {
        let (ok, err) = result_types(ty);
        Output {
            ty: Some(ty),
            ok,
            err,
        }
    }
}
