//! Request heads and bodies as the gateway's own HTTP/1.1 connection reads
//! them: any bytes, cut in two at any place, decide as when they come
//! whole, and nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let cut = usize::from(cut).min(bytes.len());
    let whole = gateway::listener::h1::replay(&[bytes], 8192);
    let pieces = gateway::listener::h1::replay(&[&bytes[..cut], &bytes[cut..]], 8192);
    assert_eq!(whole, pieces);
});
