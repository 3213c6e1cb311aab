//! Handler errors that hold an error without being one: `anyhow::Error`, `eyre::Report`,
//! `Box<dyn Error + Send + Sync>`.

use std::error::Error as StdError;
use std::fmt;

/// The error of an `#[idempotent]` handler whose function returns a *report* type — one that
/// holds a [`std::error::Error`] without implementing the trait itself, such as
/// `anyhow::Error`, `eyre::Report` or `Box<dyn Error + Send + Sync>` — so that it can be a
/// [`Handler::Error`](crate::Handler::Error).
///
/// `#[idempotent]` wraps such errors on its own (a function returning `anyhow::Result<T>` gets
/// `Error = Report<anyhow::Error>`) and passes the report's content to `permanent = ...`; a
/// function whose error implements `std::error::Error` keeps its own type. The report shows as
/// the error it holds: same message, same [`source`](StdError::source) chain.
///
/// ```
/// use idem_runtime::transport::Report;
/// let inner: Box<dyn std::error::Error + Send + Sync> = "card declined".into();
/// let report = Report::new(inner);
/// assert_eq!(report.to_string(), "card declined");
/// assert_eq!(report.into_inner().to_string(), "card declined");
/// ```
pub struct Report<E> {
    inner: E,
    // Taken from `E`'s impls by `new`: the report is an error whatever `E` is, so a wrong error
    // type is reported once, where it is wrapped.
    as_error: fn(&E) -> &(dyn StdError + Send + Sync + 'static),
    debug: fn(&E, &mut fmt::Formatter<'_>) -> fmt::Result,
}

impl<E: ReportSource> Report<E> {
    /// Wraps a report-type error.
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            as_error: E::as_error,
            debug: <E as fmt::Debug>::fmt,
        }
    }
}

impl<E> Report<E> {
    /// The wrapped error.
    pub fn get_ref(&self) -> &E {
        &self.inner
    }

    /// Unwraps the error.
    pub fn into_inner(self) -> E {
        self.inner
    }
}

impl<E> fmt::Debug for Report<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.debug)(&self.inner, f)
    }
}

impl<E> fmt::Display for Report<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt((self.as_error)(&self.inner), f)
    }
}

impl<E> StdError for Report<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        (self.as_error)(&self.inner).source()
    }
}

/// What a [`Report`] can hold: a `Debug + Send + Sync + 'static` type that gives access to a
/// `dyn Error + Send + Sync` (through `AsRef`), as `anyhow::Error`, `eyre::Report` and
/// `Box<dyn Error + Send + Sync>` do.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an error a handler can return",
    label = "not an error type",
    note = "a handler's error implements `std::error::Error + Send + Sync + 'static` (derive it with `thiserror`), or is `anyhow::Error`, `eyre::Report` or `Box<dyn std::error::Error + Send + Sync>`"
)]
pub trait ReportSource: fmt::Debug + Send + Sync + 'static {
    /// The error held.
    fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static);
}

impl<T> ReportSource for T
where
    T: AsRef<dyn StdError + Send + Sync + 'static> + fmt::Debug + Send + Sync + 'static,
{
    fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        self.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("charge failed")
        }
    }
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("card declined")
        }
    }
    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }
    impl StdError for Inner {}

    #[test]
    fn a_report_shows_as_the_error_it_holds() {
        let boxed: Box<dyn StdError + Send + Sync> = Box::new(Outer(Inner));
        let report = Report::new(boxed);
        assert_eq!(report.to_string(), "charge failed");
        assert_eq!(format!("{report:?}"), "Outer(Inner)");
        let source = report.source().expect("the held error's source");
        assert_eq!(source.to_string(), "card declined");
        assert!(report.get_ref().is::<Outer>());
    }
}
