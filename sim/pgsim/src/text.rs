//! Recognising a statement whole (`lease`, `shard`): its parameters read out of its text, and
//! the text accepted only when the adapter's builder writes it the same from those parameters.

use super::reply::{SqlError, sqlstate};

/// `parsed` when `build` writes it as exactly `text`; else 0A000 naming `builder`, the
/// adapter's function that writes the statement (`plexsphere_leader::shard_sql::take`).
pub(crate) fn rebuilt<S>(
    text: &str,
    parsed: Option<S>,
    build: impl Fn(&S) -> String,
    builder: &str,
) -> Result<S, SqlError> {
    parsed
        .filter(|statement| build(statement) == text)
        .ok_or_else(|| {
            SqlError::error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                format!("the simulated server knows this statement only as {builder} builds it"),
            )
        })
}

/// The text between the first `before` and the next `after`.
pub(crate) fn between<'a>(text: &'a str, before: &str, after: &str) -> Option<&'a str> {
    let start = text.find(before)? + before.len();
    let length = text[start..].find(after)?;
    Some(&text[start..start + length])
}

/// The text of a string literal as `quote_literal` writes it: `'…'` with doubled quotes, or
/// `E'…'` with doubled quotes and doubled backslashes.
pub(crate) fn unquote(literal: &str) -> Option<String> {
    let (escaped, body) = match literal.strip_prefix("E'") {
        Some(rest) => (true, rest),
        None => (false, literal.strip_prefix('\'')?),
    };
    let body = body.strip_suffix('\'')?;
    let text = body.replace("''", "'");
    Some(if escaped {
        text.replace("\\\\", "\\")
    } else {
        text
    })
}

/// Checks shared by the recognisers' tests.
#[cfg(test)]
pub(crate) mod checks {
    use std::fmt::Debug;

    use crate::reply::{SqlError, sqlstate};

    /// Each of `cases`, as `build` writes it (and padded with whitespace), is recognised as
    /// itself.
    pub(crate) fn recognised_as_built<S: Debug + PartialEq>(
        cases: impl IntoIterator<Item = S>,
        build: impl Fn(&S) -> String,
        recognise: impl Fn(&str) -> Option<Result<S, SqlError>>,
    ) {
        for statement in cases {
            let text = build(&statement);
            assert_eq!(recognise(&text), Some(Ok(statement)), "{text}");
            assert_eq!(
                recognise(&format!("  {text}\n")).map(|r| r.is_ok()),
                Some(true)
            );
        }
    }

    /// Each of `texts` begins like a statement but differs from what its builder writes: 0A000.
    pub(crate) fn refused<S: Debug>(
        texts: impl IntoIterator<Item = String>,
        recognise: impl Fn(&str) -> Option<Result<S, SqlError>>,
    ) {
        for text in texts {
            let error = recognise(&text).and_then(Result::err);
            assert_eq!(
                error.map(|e| e.code),
                Some(sqlstate::FEATURE_NOT_SUPPORTED),
                "{text}"
            );
        }
    }
}
