//! Cutting text to a byte bound, the one way host and guests do it: on a character boundary,
//! so a bound never splits a UTF-8 sequence (slicing there would panic).

/// Marks a shortened text, so a reader knows it goes on.
pub const ELLIPSIS: &str = "…";

/// `text` cut to at most `max` bytes on a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    text.get(..text.floor_char_boundary(max))
        .unwrap_or_default()
}

/// `text` cut to at most `max` bytes on a character boundary, ending in [`ELLIPSIS`] when it
/// was cut (and `max` leaves room for it).
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let room = if ELLIPSIS.len() <= max {
        max - ELLIPSIS.len()
    } else {
        max
    };
    text.truncate(text.floor_char_boundary(room));
    if ELLIPSIS.len() <= max {
        text.push_str(ELLIPSIS);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_respects_char_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("abc", 10), "abc");
        assert_eq!(cut("abc", 0), "");
    }

    #[test]
    fn truncate_marks_what_it_cut_and_keeps_the_bound() {
        assert_eq!(truncate("short".into(), 1024), "short");
        let exact = "x".repeat(1024);
        assert_eq!(truncate(exact.clone(), 1024), exact);
        // 'é' is two bytes: a cut at an odd offset must step back, never split it.
        let cut = truncate("é".repeat(600), 1024);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with(ELLIPSIS));
        assert!(cut.trim_end_matches(ELLIPSIS).chars().all(|c| c == 'é'));
        assert_eq!(truncate("abcdef".into(), 2), "ab", "no room for the marker");
        assert_eq!(truncate("abcdef".into(), 4), "a…");
    }
}
