//! `config::load` on arbitrary TOML text: it must answer `Ok` or `Err`, never
//! panic, whatever the text. The base folder does not exist, so relative file
//! roots are refused as they would be for a real file in a missing folder.

#![no_main]

use std::path::PathBuf;

use gateway::config::{Source, load};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let source = Source::Inline { text: text.to_owned(), base_dir: PathBuf::from("/nonexistent-fuzz-base") };
    let _ = load(&source);
});
