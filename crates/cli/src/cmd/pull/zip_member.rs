//! One member of a zip archive that reaches us in consecutive pieces without its beginning
//! (a split installer of which only some parts are published): the member's local file header
//! is found by scanning the pieces, and its deflated data is inflated from there. The central
//! directory is not needed: a deflate stream ends by itself, so sizes deferred to a data
//! descriptor or to a zip64 field do not matter.

use super::wheels::hex;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

const LOCAL_HEADER: &[u8; 4] = b"PK\x03\x04";
/// Fixed part of a local file header, signature included.
const HEADER_LEN: usize = 30;

/// The pieces read one after another as one stream.
struct Pieces {
    paths: Vec<PathBuf>,
    next: usize,
    cur: Option<File>,
}

impl Pieces {
    fn open(paths: &[PathBuf]) -> Pieces {
        Pieces { paths: paths.to_vec(), next: 0, cur: None }
    }
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(f) = &mut self.cur {
                let n = f.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                self.cur = None;
            }
            let Some(p) = self.paths.get(self.next) else { return Ok(0) };
            self.cur = Some(File::open(p)?);
            self.next += 1;
        }
    }
}

/// What a local file header says about its member.
#[derive(Debug, PartialEq, Eq)]
pub struct Member {
    /// Offset of the member's data in the pieces' stream.
    pub data_offset: u64,
    /// 0: stored, 8: deflated.
    pub method: u16,
    /// Uncompressed size where the header gives it (not deferred, not zip64).
    pub size: Option<u64>,
}

/// Scan `r` for the local file header of `name`.
pub fn find_member(r: &mut impl Read, name: &str) -> Result<Member> {
    let name = name.as_bytes();
    let keep = HEADER_LEN + name.len();
    let mut window: Vec<u8> = Vec::with_capacity((1 << 20) + keep);
    // stream offset of window[0]
    let mut base = 0u64;
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut chunk).context("reading the archive pieces")?;
        if n == 0 {
            bail!("no local header of {} in the archive pieces", String::from_utf8_lossy(name));
        }
        window.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some(i) = find(&window[at..], LOCAL_HEADER) {
            let h = at + i;
            if window.len() < h + keep {
                break; // the header's end is in the next read
            }
            let u16_at = |o: usize| u16::from_le_bytes([window[h + o], window[h + o + 1]]);
            let u32_at = |o: usize| u32::from_le_bytes(window[h + o..h + o + 4].try_into().expect("4 bytes"));
            let (flags, method, usize32) = (u16_at(6), u16_at(8), u32_at(22));
            let (name_len, extra_len) = (u16_at(26) as usize, u16_at(28) as usize);
            if name_len == name.len() && &window[h + HEADER_LEN..h + keep] == name {
                let deferred = flags & 0x8 != 0 || usize32 == u32::MAX;
                return Ok(Member {
                    data_offset: base + (h + HEADER_LEN + name_len + extra_len) as u64,
                    method,
                    size: (!deferred).then_some(usize32 as u64),
                });
            }
            at = h + 1;
        }
        // keep a tail that may hold the start of a header cut by this read
        let cut = window.len().saturating_sub(keep);
        base += cut as u64;
        window.drain(..cut);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Inflate member `name` of the archive whose consecutive pieces are `pieces` into `out`,
/// with a progress bar; returns the sha256 of what was written. The pieces are deleted after.
pub fn inflate(pieces: &[PathBuf], name: &str, out: &Path) -> Result<String> {
    let m = find_member(&mut Pieces::open(pieces), name)?;
    let mut r = BufReader::with_capacity(1 << 20, Pieces::open(pieces));
    std::io::copy(&mut (&mut r).take(m.data_offset), &mut std::io::sink())?;
    let bar = indicatif::ProgressBar::new(m.size.unwrap_or(0));
    bar.set_style(
        indicatif::ProgressStyle::with_template("unpacking {bar:40} {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut src: Box<dyn Read> = match m.method {
        8 => Box::new(flate2::bufread::DeflateDecoder::new(r)),
        0 => match m.size {
            Some(n) => Box::new(r.take(n)),
            None => bail!("{name} is stored without its size in the local header"),
        },
        other => bail!("{name} is compressed with zip method {other} (only stored and deflated are read)"),
    };
    let mut hasher = Sha256::new();
    let mut f = std::io::BufWriter::new(File::create(out).with_context(|| format!("creating {}", out.display()))?);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = src.read(&mut buf).with_context(|| format!("inflating {name}"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        f.write_all(&buf[..n])?;
        total += n as u64;
        bar.inc(n as u64);
    }
    f.flush()?;
    bar.finish_and_clear();
    if let Some(n) = m.size.filter(|&n| n != total) {
        bail!("{name}: unpacked {total} bytes, the archive says {n}");
    }
    for p in pieces {
        let _ = std::fs::remove_file(p);
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A zip archive of `members` written by the zip crate (deflated).
    fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in members {
            w.start_file(*name, opts).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn finds_and_inflates_a_member_of_a_headless_split_archive() {
        let model: Vec<u8> = (0..300_000u32).flat_map(|i| (i.wrapping_mul(2_654_435_761) >> 7).to_le_bytes()).collect();
        let filler: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let zip = archive(&[("a/filler.bin", &filler), ("a/model.gguf", &model), ("a/after.txt", b"tail")]);
        // drop the archive's beginning (the unpublished parts: into the first member) and cut
        // the rest in three
        let from = 10;
        let dir = tempfile::tempdir().unwrap();
        let rest = &zip[from..];
        let cuts = [0, rest.len() / 3, 2 * rest.len() / 3 + 17, rest.len()];
        let pieces: Vec<PathBuf> = (0..3)
            .map(|i| {
                let p = dir.path().join(format!("piece.{i:03}"));
                std::fs::write(&p, &rest[cuts[i]..cuts[i + 1]]).unwrap();
                p
            })
            .collect();
        let out = dir.path().join("model.out");
        let digest = inflate(&pieces, "a/model.gguf", &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), model);
        assert_eq!(digest, hex(&Sha256::digest(&model)));
    }

    #[test]
    fn a_header_cut_between_reads_is_found() {
        // a reader that hands out 7 bytes at a time cuts every header
        struct Trickle(Cursor<Vec<u8>>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(7);
                self.0.read(&mut buf[..n])
            }
        }
        let zip = archive(&[("x", b"first"), ("wanted/name.gguf", b"payload")]);
        let m = find_member(&mut Trickle(Cursor::new(zip.clone())), "wanted/name.gguf").unwrap();
        assert_eq!(m.method, 8);
        assert_eq!(m.size, Some(7));
        let mut d = flate2::read::DeflateDecoder::new(&zip[m.data_offset as usize..]);
        let mut s = String::new();
        d.read_to_string(&mut s).unwrap();
        assert_eq!(s, "payload");
    }

    #[test]
    fn a_missing_member_is_an_error_naming_it() {
        let zip = archive(&[("x", b"first")]);
        let e = find_member(&mut Cursor::new(zip), "nomic.gguf").unwrap_err();
        assert!(e.to_string().contains("nomic.gguf"), "{e}");
    }
}
