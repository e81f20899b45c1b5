//! The pre-tokenizers a GGUF names in `tokenizer.ggml.pre`: how byte-level BPE text is cut into
//! words before merges run. llama.cpp's converter writes the name (one per tokenizer family it
//! recognises by hash); llama.cpp maps each name to a list of regexes applied in turn, each
//! isolating its matches inside the pieces the previous one left (`src/llama-vocab.cpp`). That is
//! exactly a Hugging Face `tokenizer.json`'s `Sequence` of `Split`s with behaviour `Isolated`,
//! which is how the tokenizer is built here.
//!
//! Where llama.cpp rewrote a family's regex for its own engine (`(?i:'s|...)` spelled out as
//! `'[sS]|...`, Unicode classes replaced by lookaheads), the original from the family's
//! `tokenizer.json` is used, since Hugging Face's tokenizer (what vLLM and the model's trainers
//! used) is the reference. Families whose `tokenizer.json` normalises to NFC (Qwen2 and later) do
//! so here too; llama.cpp does not, so it differs from both on text that is not NFC.

/// How one family pre-tokenizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreTokenizer {
    /// Regexes applied in turn, each isolating its matches.
    pub splits: &'static [&'static str],
    /// Unicode NFC normalisation before splitting (Qwen's `tokenizer.json` has it).
    pub nfc: bool,
    /// A word that is itself a token is taken whole, without merges (Llama 3's `ignore_merges`).
    pub ignore_merges: bool,
    /// llama.cpp puts BOS first for this family when the file does not say
    /// (`tokenizer.ggml.add_bos_token` absent).
    pub add_bos: bool,
}

/// GPT-2's split, as Hugging Face's byte-level pre-tokenizer applies it.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// llama.cpp's form of it in its multi-regex families (no trailing `\s+`: a lone whitespace it
/// leaves unmatched becomes a piece of its own all the same).
const GPT2_SHORT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// CJK ideographs, and (as DeepSeek wrote it) everything from U+0800 to them, and Hangul.
const DEEPSEEK_CJK: &str = r"[一-龥ࠀ-一가-\x{D7FF}]+";
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟\x{3000}-。]+",
    r"\s+$",
    DEEPSEEK_CJK,
    r"\p{N}+",
];
const DEEPSEEK_CODER: &[&str] = &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"];
const DEEPSEEK_V3: &[&str] = &[
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
/// llama.cpp's `default`: what a file without a known family gets.
const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2_SHORT, r"\p{N}+", "[0-9][0-9][0-9]"];
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_SHORT, "[0-9][0-9][0-9]"];
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

const fn pre(splits: &'static [&'static str]) -> PreTokenizer {
    PreTokenizer { splits, nfc: false, ignore_merges: false, add_bos: false }
}

/// Llama 3's family: words in the vocabulary taken whole, BOS by default.
const LLAMA3_FAMILY: PreTokenizer = PreTokenizer { splits: &[LLAMA3], nfc: false, ignore_merges: true, add_bos: true };
const QWEN2_FAMILY: PreTokenizer = PreTokenizer { splits: &[QWEN2], nfc: true, ignore_merges: false, add_bos: false };

/// Every name tandem serves, grouped by family (the names llama.cpp maps to each).
const FAMILIES: &[(&[&str], PreTokenizer)] = &[
    (
        &[
            "gpt2",
            "gpt-2",
            "phi-2",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "trillion",
            "granite-docling",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "jina-es",
            "jina-de",
            "jina-v2-es",
            "jina-v2-de",
        ],
        pre(&[GPT2]),
    ),
    (
        &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"],
        pre(&[r"\p{N}", GPT2_SHORT]),
    ),
    (&["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"], LLAMA3_FAMILY),
    (&["dbrx", "smaug-bpe", "chatglm-bpe"], pre(&[LLAMA3])),
    // llama.cpp takes glm4's words whole but adds no BOS for it.
    (&["glm4"], PreTokenizer { add_bos: false, ..LLAMA3_FAMILY }),
    (&["qwen2", "deepseek-r1-qwen"], QWEN2_FAMILY),
    (&["qwen35"], PreTokenizer { splits: &[QWEN35], ..QWEN2_FAMILY }),
    (&["stablelm2", "megrez", "hunyuan", "kormo"], pre(&[QWEN2])),
    (&["deepseek-llm"], pre(DEEPSEEK_LLM)),
    (&["deepseek-coder"], pre(DEEPSEEK_CODER)),
    (&["deepseek-v3", "hunyuan-dense"], pre(DEEPSEEK_V3)),
    (&["default"], pre(DEFAULT)),
    (&["falcon"], pre(FALCON)),
    (&["tekken"], PreTokenizer { splits: &[TEKKEN], ..LLAMA3_FAMILY }),
    (&["gpt-4o", "llama4"], pre(&[GPT4O])),
    (&["seed-coder"], pre(&[SEED_CODER])),
    (&["bloom", "poro-chat", "gpt3-finnish"], pre(&[BLOOM])),
    (&["viking"], pre(&[BLOOM, r"\p{N}"])),
];

/// The pre-tokenizer a `tokenizer.ggml.pre` names. An absent key is llama.cpp's `default`.
pub(crate) fn lookup(name: &str) -> Option<PreTokenizer> {
    let name = if name.is_empty() { "default" } else { name };
    FAMILIES.iter().find(|(names, _)| names.contains(&name)).map(|(_, p)| *p)
}

/// Every supported name, for the message that refuses the others.
pub(crate) fn supported() -> Vec<&'static str> {
    FAMILIES.iter().flat_map(|(names, _)| names.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `text` as the family would (regexes in turn, matches isolated), for the tests.
    fn split(p: &PreTokenizer, text: &str) -> Vec<String> {
        let mut pieces = vec![text.to_string()];
        for re in p.splits {
            let re = fancy_regex::Regex::new(re).unwrap();
            let mut next = Vec::new();
            for piece in pieces {
                let mut at = 0;
                for m in re.find_iter(&piece) {
                    let m = m.unwrap();
                    if m.start() > at {
                        next.push(piece[at..m.start()].to_string());
                    }
                    if !m.as_str().is_empty() {
                        next.push(m.as_str().to_string());
                    }
                    at = m.end();
                }
                if at < piece.len() {
                    next.push(piece[at..].to_string());
                }
            }
            pieces = next;
        }
        pieces
    }

    #[test]
    fn every_family_compiles() {
        for (names, p) in FAMILIES {
            for re in p.splits {
                assert!(fancy_regex::Regex::new(re).is_ok(), "{names:?}: {re}");
            }
        }
    }

    #[test]
    fn names_are_unique_and_unknown_ones_refused() {
        let all = supported();
        let mut sorted = all.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
        assert!(lookup("qwen2").is_some() && lookup("").is_some() && lookup("no-such-family").is_none());
    }

    #[test]
    fn families_split_numbers_as_their_tokenizers_do() {
        // Qwen2: one digit a piece; Llama 3: up to three; GPT-2: the whole run with its space.
        assert_eq!(split(&lookup("qwen2").unwrap(), "x 12345"), ["x", " ", "1", "2", "3", "4", "5"]);
        assert_eq!(split(&lookup("llama-bpe").unwrap(), "x 12345"), ["x", " ", "123", "45"]);
        assert_eq!(split(&lookup("gpt2").unwrap(), "x 12345"), ["x", " 12345"]);
        assert_eq!(split(&lookup("smollm").unwrap(), "x 12"), ["x", " ", "1", "2"]);
    }

    #[test]
    fn llama3_keeps_a_leading_non_letter_with_its_word_and_newlines_apart() {
        let p = lookup("llama-bpe").unwrap();
        assert_eq!(split(&p, "Hello, world!\n\n  x"), ["Hello", ",", " world", "!\n\n", " ", " x"]);
        assert_eq!(split(&p, "I'M here"), ["I", "'M", " here"]);
    }

    #[test]
    fn deepseek_coder_cuts_cjk_and_punctuation_apart() {
        let p = lookup("deepseek-coder").unwrap();
        assert_eq!(split(&p, "fn 你好(x)"), ["fn", " ", "你好", "(", "x", ")"]);
    }
}
