//! Stop strings over streamed text: text is released only once no stop string can still begin
//! in it, so a match that spans tokens is never half-emitted.

/// Per-choice stop-string state.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    include: bool,
    /// Longest stop string, in bytes; that many bytes minus one are held back.
    hold: usize,
    text: String,
    emitted: usize,
}

/// Result of adding text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// Text that can be sent now.
    pub emit: String,
    /// The stop string that matched, if one did; generation ends.
    pub matched: Option<String>,
}

impl StopStrings {
    pub fn new(stops: &[String], include_stop_str_in_output: bool) -> Self {
        let hold = stops.iter().map(String::len).max().unwrap_or(0).saturating_sub(1);
        StopStrings { stops: stops.to_vec(), include: include_stop_str_in_output, hold, ..Default::default() }
    }

    /// Adds generated text. With `check` false (inside `min_tokens`) stops are not looked for.
    pub fn push(&mut self, new: &str, check: bool) -> Pushed {
        let search_from = floor_boundary(&self.text, self.emitted.saturating_sub(self.hold));
        self.text.push_str(new);
        if check {
            // The stop completing earliest wins.
            let found = self
                .stops
                .iter()
                .filter_map(|s| self.text[search_from..].find(s.as_str()).map(|p| (search_from + p, s)))
                .min_by_key(|(p, s)| p + s.len());
            if let Some((pos, s)) = found {
                let end = if self.include { pos + s.len() } else { pos };
                let emit = self.text[self.emitted.min(end)..end].to_string();
                self.emitted = end.max(self.emitted);
                self.text.truncate(end);
                return Pushed { emit, matched: Some(s.clone()) };
            }
        }
        let safe = floor_boundary(&self.text, self.text.len().saturating_sub(self.hold)).max(self.emitted);
        let emit = self.text[self.emitted..safe].to_string();
        self.emitted = safe;
        Pushed { emit, matched: None }
    }

    /// Releases whatever is held back (the choice ended for another reason).
    pub fn flush(&mut self) -> String {
        let rest = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        rest
    }

    /// All text released or held so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], include: bool, pieces: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopStrings::new(&stops, include);
        let mut out = String::new();
        for p in pieces {
            let r = s.push(p, true);
            out.push_str(&r.emit);
            if r.matched.is_some() {
                return (out, r.matched);
            }
        }
        out.push_str(&s.flush());
        (out, None)
    }

    #[test]
    fn stop_across_token_boundaries() {
        assert_eq!(run(&["END"], false, &["hello E", "N", "D more"]), ("hello ".into(), Some("END".into())));
        assert_eq!(run(&["END"], true, &["hello E", "N", "D more"]), ("hello END".into(), Some("END".into())));
        assert_eq!(run(&["END"], false, &["hello E", "Nx"]), ("hello ENx".into(), None));
    }

    #[test]
    fn earliest_completion_wins_and_nothing_is_leaked() {
        assert_eq!(run(&["bc", "abcd"], false, &["xabcd"]), ("xa".into(), Some("bc".into())));
        let stops = vec!["STOP".to_string()];
        let mut s = StopStrings::new(&stops, false);
        assert_eq!(s.push("abST", true).emit, "a");
        // Only the last len("STOP") - 1 bytes are held: "b" cannot start a match any more.
        assert_eq!(s.push("O", true).emit, "b");
        assert_eq!(s.push("P", true), Pushed { emit: "".into(), matched: Some("STOP".into()) });
    }

    #[test]
    fn multibyte_text_is_split_on_boundaries() {
        assert_eq!(run(&["éé"], false, &["aé", "bé", "é"]), ("aéb".into(), Some("éé".into())));
        assert_eq!(run(&[], false, &["ü", "ß"]), ("üß".into(), None));
    }

    #[test]
    fn unchecked_text_is_not_matched() {
        let stops = vec!["x".to_string()];
        let mut s = StopStrings::new(&stops, false);
        assert_eq!(s.push("x", false).matched, None);
        assert_eq!(s.push("yx", true).matched, Some("x".into()));
    }
}
