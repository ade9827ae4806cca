//! A queue task's payload as the CLI stores it: the command line, as JSON `{"argv": [...]}`.

use serde_json::{json, Value};

/// The command line a task runs, as stored in its payload.
pub(crate) fn encode_command(argv: &[String]) -> String {
    json!({ "argv": argv }).to_string()
}

/// The command line of a payload.
///
/// # Errors
/// What is wrong with a payload that is not `{"argv": [non-empty list of strings]}`.
pub(crate) fn decode_command(payload: &str) -> Result<Vec<String>, String> {
    let v: Value = serde_json::from_str(payload).map_err(|e| format!("not JSON: {e}"))?;
    let argv = v
        .get("argv")
        .and_then(Value::as_array)
        .ok_or("no \"argv\" list")?;
    let argv: Vec<String> = argv
        .iter()
        .map(|a| {
            a.as_str()
                .map(str::to_owned)
                .ok_or("argv holds a non-string")
        })
        .collect::<Result<_, _>>()?;
    if argv.is_empty() {
        return Err("empty argv".into());
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_and_bad_payloads_are_explained() {
        let argv = vec!["echo".to_owned(), "a b".to_owned()];
        assert_eq!(decode_command(&encode_command(&argv)).unwrap(), argv);
        assert!(decode_command("nope").unwrap_err().contains("not JSON"));
        assert!(decode_command("{}").unwrap_err().contains("argv"));
        assert!(decode_command(r#"{"argv":[]}"#)
            .unwrap_err()
            .contains("empty"));
        assert!(decode_command(r#"{"argv":[1]}"#)
            .unwrap_err()
            .contains("non-string"));
    }
}
