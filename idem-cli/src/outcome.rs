//! How a command ends: done in one of several ways, or failed in a way that has an exit code of
//! its own.

use std::error::Error;
use std::process::ExitCode;

/// What a command gives: how it ended, or its failure.
pub(crate) type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// How a command ended, short of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    /// It did what was asked.
    Ok,
    /// What was asked is not a valid request (a key idem would refuse).
    Usage,
    /// The operator declined to confirm.
    Declined,
    /// The record, run or queue asked for does not exist.
    NotFound,
    /// Refused as things stand (a live claim, a queue whose letters a look would count), or
    /// the record changed while the command ran: nothing was done.
    Refused,
    /// Done in part: what was asked could not all be done.
    Partly,
}

impl Done {
    /// The exit code that says it.
    pub(crate) fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            Done::Ok => 0,
            Done::Usage | Done::Declined => 2,
            Done::NotFound => 3,
            Done::Refused => 4,
            Done::Partly => 5,
        })
    }
}

/// A failure because what the command was asked about does not exist (exit 3).
#[derive(Debug)]
pub(crate) struct NotFound(pub(crate) String);

/// A failure because the command refuses to act as things stand (exit 4): doing it could make
/// things worse.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) String);

/// A failure the command already reported on standard output (exit 1).
#[derive(Debug)]
pub(crate) struct Reported(pub(crate) String);

macro_rules! message_error {
    ($($name:ident),*) => {$(
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl std::error::Error for $name {}
    )*};
}
message_error!(NotFound, Refused, Reported);

/// The exit code of a failure: its kind's, 1 for any other.
pub(crate) fn failure_code(error: &(dyn Error + 'static)) -> ExitCode {
    if error.is::<NotFound>() {
        Done::NotFound.exit_code()
    } else if error.is::<Refused>() {
        Done::Refused.exit_code()
    } else {
        ExitCode::FAILURE
    }
}
