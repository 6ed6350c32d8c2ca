//! OP_COMPRESSED payload compression: noop (0), snappy (1, raw format), zlib (2) and zstd (3).
//!
//! Invariants:
//! * [`decompress`] never produces, and never allocates for, more than the `uncompressedSize`
//!   the header declared, and the caller has already checked that size against
//!   [`MAX_MESSAGE_SIZE`](crate::MAX_MESSAGE_SIZE). A payload that inflates to more or fewer
//!   bytes than declared is an error, not a truncated message.
//! * Errors are `ProtocolError` (17): mongod reports corrupt compressed messages at the transport
//!   layer and closes the connection; so do we (see `server`).

use std::io::Read;

use crate::error::{ErrorCode, MongoError};
use crate::message::Compressor;

/// Upper bound on the buffer reserved up front for streaming decompressors; the rest grows only
/// as real output appears, so a tiny frame declaring a huge size cannot make us allocate it.
const INITIAL_RESERVE: usize = 1 << 20;

/// zlib level mongod uses by default (`zlibCompressionLevel` is 6).
const ZLIB_LEVEL: u32 = 6;
/// zstd's default level.
const ZSTD_LEVEL: i32 = 0;

/// Compresses `input` with `compressor`.
pub fn compress(compressor: Compressor, input: &[u8]) -> Result<Vec<u8>, MongoError> {
    match compressor {
        Compressor::Noop => Ok(input.to_vec()),
        Compressor::Snappy => snap::raw::Encoder::new()
            .compress_vec(input)
            .map_err(|e| failed("snappy compression", &e)),
        Compressor::Zlib => {
            use std::io::Write;
            let mut enc = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(input.len() / 2 + 64),
                flate2::Compression::new(ZLIB_LEVEL),
            );
            enc.write_all(input)
                .and_then(|()| enc.finish())
                .map_err(|e| failed("zlib compression", &e))
        }
        Compressor::Zstd => {
            zstd::bulk::compress(input, ZSTD_LEVEL).map_err(|e| failed("zstd compression", &e))
        }
    }
}

/// Decompresses `input`, which must inflate to exactly `expected_len` bytes.
pub fn decompress(
    compressor: Compressor,
    input: &[u8],
    expected_len: usize,
) -> Result<Vec<u8>, MongoError> {
    let out = match compressor {
        Compressor::Noop => input.to_vec(),
        Compressor::Snappy => {
            // The raw format states its length first: check it before allocating.
            let declared =
                snap::raw::decompress_len(input).map_err(|e| failed("snappy decompression", &e))?;
            if declared != expected_len {
                return Err(size_mismatch(expected_len, declared));
            }
            snap::raw::Decoder::new()
                .decompress_vec(input)
                .map_err(|e| failed("snappy decompression", &e))?
        }
        Compressor::Zlib => read_bounded(flate2::read::ZlibDecoder::new(input), expected_len)
            .map_err(|e| failed("zlib decompression", &e))?,
        Compressor::Zstd => {
            let dec = zstd::stream::read::Decoder::with_buffer(input)
                .map_err(|e| failed("zstd decompression", &e))?;
            read_bounded(dec, expected_len).map_err(|e| failed("zstd decompression", &e))?
        }
    };
    if out.len() != expected_len {
        return Err(size_mismatch(expected_len, out.len()));
    }
    Ok(out)
}

/// Reads at most `limit + 1` bytes (one more than allowed, to detect overlong output).
fn read_bounded(reader: impl Read, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(limit.min(INITIAL_RESERVE));
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map(|_| out)
}

fn failed(what: &str, e: &dyn std::fmt::Display) -> MongoError {
    MongoError::new(ErrorCode::PROTOCOL_ERROR, format!("{what} failed: {e}"))
}

fn size_mismatch(expected: usize, got: usize) -> MongoError {
    MongoError::new(
        ErrorCode::PROTOCOL_ERROR,
        format!(
            "Decompressing message returned less data than expected: declared uncompressedSize \
             {expected}, got {got}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Compressor; 4] = [
        Compressor::Noop,
        Compressor::Snappy,
        Compressor::Zlib,
        Compressor::Zstd,
    ];

    #[test]
    fn every_compressor_round_trips() {
        let input: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for c in ALL {
            let packed = compress(c, &input).unwrap();
            assert_eq!(decompress(c, &packed, input.len()).unwrap(), input, "{c:?}");
        }
    }

    #[test]
    fn output_longer_or_shorter_than_declared_is_rejected() {
        let input = vec![7u8; 4096];
        for c in ALL {
            let packed = compress(c, &input).unwrap();
            let short = decompress(c, &packed, 100).unwrap_err();
            assert_eq!(short.code, 17, "{c:?}");
            let long = decompress(c, &packed, 5000).unwrap_err();
            assert_eq!(long.code, 17, "{c:?}");
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for c in [Compressor::Snappy, Compressor::Zlib, Compressor::Zstd] {
            assert!(
                decompress(c, b"\xff\xff\xff\xff\x0fgarbage", 10).is_err(),
                "{c:?}"
            );
        }
    }
}
