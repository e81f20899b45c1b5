//! Rules for the names that make up a model address `{entity}/{project}/{name}[:stepN]`.

/// Longest entity, project or model name accepted.
pub const MAX_NAME_LEN: usize = 128;

/// Why a name cannot be used in a model address, or `None` if it can.
///
/// A name must survive being written into `wandb-artifact:///{entity}/{project}/{name}:step{N}`
/// and parsed back, so it may not contain `/`, whitespace or control characters, and may not end
/// in something that reads as a `:stepN` suffix.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("must not be empty");
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Some("must be at most 128 characters");
    }
    if name.chars().any(|c| c == '/' || c.is_whitespace() || c.is_control()) {
        return Some("must not contain '/', whitespace or control characters");
    }
    if split_step_suffix(name).1.is_some() {
        return Some("must not end in ':step<N>'");
    }
    None
}

/// Splits `name:step12` into (`name`, Some(12)); anything else is returned whole.
pub fn split_step_suffix(s: &str) -> (&str, Option<i64>) {
    if let Some((head, tail)) = s.rsplit_once(":step") {
        if !tail.is_empty() && tail.len() <= 18 && tail.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = tail.parse() {
                return (head, Some(n));
            }
        }
    }
    (s, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name_problem("agent-001.v2_x"), None);
        assert!(name_problem("").is_some());
        assert!(name_problem("a/b").is_some());
        assert!(name_problem("a b").is_some());
        assert!(name_problem("run:step3").is_some());
        assert_eq!(name_problem("run:stepper"), None);
        assert!(name_problem(&"x".repeat(129)).is_some());
    }

    #[test]
    fn step_suffix() {
        assert_eq!(split_step_suffix("m:step12"), ("m", Some(12)));
        assert_eq!(split_step_suffix("m:step"), ("m:step", None));
        assert_eq!(split_step_suffix("m"), ("m", None));
        assert_eq!(split_step_suffix("a:step1:step2"), ("a:step1", Some(2)));
    }
}
