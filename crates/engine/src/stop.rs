//! Stop strings over streamed text: text that might be the start of a stop string is held
//! back until it is known not to be one, so a stop string never reaches the client.

pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    pending: String,
}

/// What to do with newly generated text.
#[derive(Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// Emit this text and continue.
    Continue(String),
    /// A stop string was found: emit the text before it and stop.
    Stop(String),
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), pending: String::new() }
    }

    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.pending.push_str(text);
        if let Some(i) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..i].to_string();
            self.pending.clear();
            return StopOutcome::Stop(out);
        }
        // hold back the longest suffix that is a proper prefix of some stop string
        let mut hold = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if self.pending.ends_with(&s[..k]) {
                    hold = hold.max(k);
                }
            }
        }
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopOutcome::Continue(out)
    }

    /// End of generation: release what was held back.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stop_split_across_pieces() {
        let mut m = StopMatcher::new(&["\n\nUser:".to_string()]);
        assert_eq!(m.push("Hello\n"), StopOutcome::Continue("Hello".into()));
        assert_eq!(m.push("\nUs"), StopOutcome::Continue("".into()));
        assert_eq!(m.push("er: hi"), StopOutcome::Stop("".into()));
    }

    #[test]
    fn false_alarm_is_released() {
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("the EN"), StopOutcome::Continue("the ".into()));
        assert_eq!(m.push("D? no, ENTER"), StopOutcome::Stop("".into()));
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("EN"), StopOutcome::Continue("".into()));
        assert_eq!(m.push("TER"), StopOutcome::Continue("ENTER".into()));
        assert_eq!(m.flush(), "");
    }

    proptest! {
        #[test]
        fn output_is_text_before_first_stop(text in "[ab\\n]{0,40}", cuts in proptest::collection::vec(0usize..40, 0..6)) {
            let stop = "ab\n".to_string();
            let mut m = StopMatcher::new(std::slice::from_ref(&stop));
            let mut pieces = vec![];
            let mut last = 0;
            let mut cuts = cuts; cuts.sort();
            for c in cuts { let c = c.min(text.len()); if c > last { pieces.push(&text[last..c]); last = c; } }
            pieces.push(&text[last..]);
            let mut out = String::new();
            let mut stopped = false;
            for p in pieces {
                match m.push(p) {
                    StopOutcome::Continue(s) => out.push_str(&s),
                    StopOutcome::Stop(s) => { out.push_str(&s); stopped = true; break; }
                }
            }
            if !stopped { out.push_str(&m.flush()); }
            let expect = match text.find(&stop) { Some(i) => &text[..i], None => &text[..] };
            prop_assert_eq!(out, expect);
        }
    }
}
