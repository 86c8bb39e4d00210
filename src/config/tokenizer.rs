//! A model's declared tokenizer (`tokenizer:` in `models.yaml`, a Hugging Face
//! `tokenizer.json`), loaded once with the catalog so a request never touches the disk and
//! a missing or invalid file is a config problem at start, not a failure per request.

use std::path::Path;

/// Text at most this long is encoded in one call; longer text is cut at char boundaries and
/// counted piece by piece, so one huge message never builds one huge encoding.
const PIECE_BYTES: usize = 64 * 1024;

pub struct PromptTokenizer {
    inner: tokenizers::Tokenizer,
    /// The file it came from (for logs and `Debug`).
    pub source: String,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PromptTokenizer({})", self.source)
    }
}

impl PromptTokenizer {
    pub fn load(path: &Path) -> Result<PromptTokenizer, String> {
        let inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| format!("cannot load `{}`: {e}", path.display()))?;
        Ok(PromptTokenizer { inner, source: path.display().to_string() })
    }

    /// Tokens of `text`, without special tokens (the chat template's overhead is counted by
    /// the caller, per message). An encoding failure counts the text at four bytes a token.
    pub fn count(&self, text: &str) -> u64 {
        let mut total = 0u64;
        let mut rest = text;
        while !rest.is_empty() {
            let mut cut = rest.len().min(PIECE_BYTES);
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            let (piece, tail) = rest.split_at(cut);
            total += match self.inner.encode_fast(piece, false) {
                Ok(enc) => enc.len() as u64,
                Err(_) => (piece.len() as u64).div_ceil(4),
            };
            rest = tail;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PromptTokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/tiny-bpe.json");
        PromptTokenizer::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn counts_like_the_python_tokenizers_library() {
        // 13 is what `tokenizers` 0.23 (Python) gives for this text with this file.
        assert_eq!(fixture().count("Say hello to the gateway, please."), 13);
        assert_eq!(fixture().count(""), 0);
    }

    #[test]
    fn long_text_is_counted_in_pieces_without_losing_tokens() {
        let t = fixture();
        // 160 KB, three pieces: " gateway" is one token of the fixture, so about one a word
        // (a cut may split one word in two).
        let text = "gateway ".repeat(20_000);
        let n = t.count(&text);
        assert!((20_000..=20_010).contains(&n), "{n}");
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let e = PromptTokenizer::load(Path::new("/nonexistent/tokenizer.json")).err().unwrap_or_default();
        assert!(e.contains("/nonexistent/tokenizer.json"), "{e}");
    }
}
