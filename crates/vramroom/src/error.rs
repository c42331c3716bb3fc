//! The CLI's one error: what the user got wrong, printed as one line by `main`.

/// Errors the user caused (bad input) exit 2, like clap's own usage errors.
pub struct UserError(pub anyhow::Error);

impl<E: Into<anyhow::Error>> From<E> for UserError {
    fn from(e: E) -> Self {
        UserError(e.into())
    }
}
