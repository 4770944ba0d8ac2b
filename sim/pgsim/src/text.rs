//! Reading the parameters of a statement recognised whole (`lease`, `shard`) out of its
//! text, as the adapter's builders write them.

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
