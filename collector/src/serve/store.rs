//! Trace storage for `gpucollect serve`: a local directory (default) or any S3-compatible object
//! store. Uploads stream in: every chunk is validated by the trace decoder and written out as
//! it arrives, so memory stays bounded whatever the trace size. Decoding runs on tokio's
//! blocking pool, a batch of up to 256 KiB at a time, so a costly upload never stalls the
//! async workers that answer other requests. A trace becomes visible only when complete: a
//! local upload goes to a temporary file that is fsynced and renamed; an S3 upload is a
//! multipart upload that is completed at the end (and aborted on any error).
//!
//! Several servers may share a local store folder: each stages its uploads in its own
//! `tmp/<instance>/` folder, marked live by an OS file lock on `tmp/<instance>/lock` that
//! the kernel drops when the process ends. At start a server removes only folders whose lock
//! it can take (their server is gone).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use analysis_core::decode::{DecodeError, Decoder};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};
use tokio::io::AsyncWriteExt;

use super::ids::TraceId;

/// Where traces live.
#[derive(Clone, Debug)]
pub enum Store {
    /// `<root>/traces/<id>.msgpack`, with uploads staged in `<root>/tmp/<instance>/`, and the
    /// summaries made of them in `<root>/summaries/<id>.summary`.
    Local {
        root: PathBuf,
        instance: Arc<Instance>,
    },
    /// `<prefix>/<id>.msgpack` in an object store, and the summaries made of them in
    /// `<prefix>/summaries/<id>.summary`.
    Object {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        label: String,
    },
}

/// This server's staging folder in a local store, and the lock that marks it live.
#[derive(Debug)]
pub struct Instance {
    dir: PathBuf,
    _lock: std::fs::File,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One stored trace, for retention.
#[derive(Clone, Debug)]
pub struct StoredTrace {
    pub id: TraceId,
    pub size_bytes: u64,
    pub modified: SystemTime,
}

/// Why an upload was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the upload is larger than this server's limit of {limit_bytes} bytes")]
    TooLarge { limit_bytes: u64 },
    #[error("the upload was refused: {0}")]
    NotATrace(String),
    #[error("the upload was interrupted: {0}")]
    Interrupted(String),
    #[error("the upload took too long: {0}")]
    TimedOut(String),
    #[error(
        "the upload was refused: it is mostly damage ({0}); check the file with \
         `gpucollect report` and upload an intact trace"
    )]
    Damaged(String),
    #[error("the trace could not be stored: {0}")]
    Storage(String),
}

/// What an accepted upload contained.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UploadSummary {
    pub bytes: u64,
    pub records: u64,
    /// The first `WARNINGS_SHOWN` warnings.
    pub warnings: Vec<String>,
    /// All warnings, including those not shown.
    pub warnings_total: u64,
}

/// Warnings an upload answer lists; the rest are only counted.
pub const WARNINGS_SHOWN: usize = 20;
/// An upload with more warnings than this is refused as damaged.
pub const MAX_WARNINGS: u64 = 10_000;
/// Below this many warnings an upload is never refused as damaged.
const DAMAGE_FLOOR: u64 = 100;
/// Bytes handed to the decoder at a time, on the blocking pool.
const BATCH_BYTES: usize = 256 * 1024;

/// Feeds upload chunks to the decoder, discarding records, to reject anything that is not a
/// trace as early as possible with bounded memory.
struct Validator {
    decoder: Decoder,
}

impl Validator {
    fn new() -> Self {
        Self {
            decoder: Decoder::new(),
        }
    }

    fn push(&mut self, chunk: &[u8]) -> Result<(), UploadError> {
        self.decoder.push(chunk);
        loop {
            match self.decoder.next_record() {
                Ok(Some(_)) => {}
                Ok(None) => return self.check_damage(0),
                Err(e) => return Err(not_a_trace(&e)),
            }
        }
    }

    /// Refuses an upload that is mostly damage: more than `MAX_WARNINGS` warnings, or (past
    /// `DAMAGE_FLOOR`) more damaged records than good ones. Checked after every batch, so the
    /// decoder never holds more than one batch's worth of warnings beyond the limit.
    fn check_damage(&self, more: u64) -> Result<(), UploadError> {
        // All of them: the decoder keeps only the first of each kind.
        let warnings = self.decoder.warning_count() + more;
        let records = self.decoder.records_decoded();
        if warnings > MAX_WARNINGS || (warnings > DAMAGE_FLOOR && warnings > records) {
            let first = self
                .decoder
                .warnings()
                .first()
                .map(|w| format!("; the first: {w}"))
                .unwrap_or_default();
            return Err(UploadError::Damaged(format!(
                "{warnings} warnings against {records} good records{first}"
            )));
        }
        Ok(())
    }

    fn finish(mut self, bytes: u64) -> Result<UploadSummary, UploadError> {
        let warnings = self.decoder.finish().map_err(|e| not_a_trace(&e))?;
        if let Some(e) = self.decoder.fatal() {
            return Err(not_a_trace(e));
        }
        self.check_damage(0)?;
        Ok(UploadSummary {
            bytes,
            records: self.decoder.records_decoded(),
            warnings: warnings
                .iter()
                .take(WARNINGS_SHOWN)
                .map(ToString::to_string)
                .collect(),
            warnings_total: self.decoder.warning_count(),
        })
    }
}

/// Decodes a batch on the blocking pool; gives the validator and the batch back.
async fn validate(
    mut v: Validator,
    batch: Vec<Bytes>,
) -> Result<(Validator, Vec<Bytes>), UploadError> {
    tokio::task::spawn_blocking(move || {
        for c in &batch {
            v.push(c)?;
        }
        Ok((v, batch))
    })
    .await
    .map_err(storage)?
}

/// Reads the next batch of at most about `BATCH_BYTES` from an upload body, counting bytes
/// against the limit as they arrive. An empty batch means the body ended.
async fn next_batch<S>(
    body: &mut S,
    bytes: &mut u64,
    limit_bytes: u64,
) -> Result<Vec<Bytes>, UploadError>
where
    S: Stream<Item = Result<Bytes, UploadError>> + Unpin,
{
    let mut batch = Vec::new();
    let mut len = 0;
    while len < BATCH_BYTES {
        let Some(chunk) = body.next().await else {
            break;
        };
        let chunk = chunk?;
        *bytes += chunk.len() as u64;
        if *bytes > limit_bytes {
            return Err(UploadError::TooLarge { limit_bytes });
        }
        len += chunk.len();
        if !chunk.is_empty() {
            batch.push(chunk);
        }
    }
    Ok(batch)
}

/// Removes a staged upload unless it was completed; also when the upload's task is dropped
/// mid-way (a client gone, a shutdown).
struct Staged {
    path: PathBuf,
    done: bool,
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn not_a_trace(e: &DecodeError) -> UploadError {
    UploadError::NotATrace(e.to_string())
}

fn storage<E: std::fmt::Display>(e: E) -> UploadError {
    UploadError::Storage(e.to_string())
}

impl Store {
    /// A local store; creates its folders, takes a staging folder of its own and removes
    /// those of servers that are gone (uploads a crash left half-written). Another server's
    /// live staging folder is left alone.
    pub async fn local(root: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        for sub in ["traces", "tmp", "summaries"] {
            tokio::fs::create_dir_all(root.join(sub))
                .await
                .with_context(|| {
                    format!(
                        "cannot create the store folder {}",
                        root.join(sub).display()
                    )
                })?;
        }
        let name = TraceId::random()?.to_string();
        let dir = root.join("tmp").join(&name[..16]);
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create the staging folder {}", dir.display()))?;
        let lock = std::fs::File::create(dir.join("lock"))
            .and_then(|f| f.lock().map(|()| f))
            .with_context(|| format!("cannot lock the staging folder {}", dir.display()))?;
        let instance = Arc::new(Instance { dir, _lock: lock });
        let mut tmp = tokio::fs::read_dir(root.join("tmp")).await?;
        while let Some(e) = tmp.next_entry().await? {
            let path = e.path();
            if path == instance.dir {
                continue;
            }
            if e.file_type().await?.is_dir() {
                // Live while its server holds the lock; a missing lock file means its server
                // died before taking it, or it is being removed.
                let stale = match std::fs::File::open(path.join("lock")) {
                    Ok(f) => f.try_lock().is_ok(),
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                };
                if stale {
                    let _ = tokio::fs::remove_dir_all(&path).await;
                }
            } else {
                // An older server's staging file: such servers did not share folders.
                let _ = tokio::fs::remove_file(&path).await;
            }
        }
        Ok(Self::Local {
            root: root.to_path_buf(),
            instance,
        })
    }

    /// An S3-compatible store from `s3://bucket/prefix`. Credentials, region and endpoint come
    /// from the usual AWS environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint).
    pub fn s3(url: &str) -> anyhow::Result<Self> {
        use anyhow::Context;
        let rest = url
            .strip_prefix("s3://")
            .context("an object store location must look like s3://bucket/prefix")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            anyhow::bail!("the store URL {url} names no bucket: use s3://bucket/prefix");
        }
        let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
            b = b.with_endpoint(endpoint);
        }
        let store = b
            .build()
            .with_context(|| format!("cannot configure the object store {url}"))?;
        Ok(Self::Object {
            store: Arc::new(store),
            prefix: ObjectPath::from(prefix.trim_matches('/')),
            label: url.to_owned(),
        })
    }

    /// Human-readable location, for logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Local { root, .. } => format!("local directory {}", root.display()),
            Self::Object { label, .. } => format!("object store {label}"),
        }
    }

    fn object_path(prefix: &ObjectPath, id: &TraceId) -> ObjectPath {
        prefix.child(format!("{id}.msgpack"))
    }

    /// Streams an upload into the store under `id`. On any error nothing is left behind.
    /// The body's errors (a client gone, a timeout) are passed through as they are.
    pub async fn put<S>(
        &self,
        id: &TraceId,
        body: S,
        limit_bytes: u64,
    ) -> Result<UploadSummary, UploadError>
    where
        S: Stream<Item = Result<Bytes, UploadError>> + Unpin,
    {
        // A batch ends when the body does; the next batch must then see the end again.
        let mut body = body.fuse();
        let mut v = Validator::new();
        let mut bytes = 0u64;
        match self {
            Self::Local { root, instance } => {
                let mut staged = Staged {
                    path: instance.dir.join(format!("{id}.part")),
                    done: false,
                };
                let mut f = tokio::fs::File::create(&staged.path)
                    .await
                    .map_err(storage)?;
                loop {
                    let batch = next_batch(&mut body, &mut bytes, limit_bytes).await?;
                    if batch.is_empty() {
                        break;
                    }
                    let (back, batch) = validate(v, batch).await?;
                    v = back;
                    for c in &batch {
                        f.write_all(c).await.map_err(storage)?;
                    }
                }
                let summary = v.finish(bytes)?;
                f.flush().await.map_err(storage)?;
                f.sync_all().await.map_err(storage)?;
                drop(f);
                let dest = root.join("traces").join(format!("{id}.msgpack"));
                tokio::fs::rename(&staged.path, &dest)
                    .await
                    .map_err(storage)?;
                staged.done = true;
                // Make the rename itself durable.
                let dir = tokio::fs::File::open(root.join("traces"))
                    .await
                    .map_err(storage)?;
                dir.sync_all().await.map_err(storage)?;
                Ok(summary)
            }
            Self::Object { store, prefix, .. } => {
                let path = Self::object_path(prefix, id);
                let upload = store.put_multipart(&path).await.map_err(storage)?;
                let mut w = WriteMultipart::new(upload);
                let result = async {
                    loop {
                        let batch = next_batch(&mut body, &mut bytes, limit_bytes).await?;
                        if batch.is_empty() {
                            break;
                        }
                        let (back, batch) = validate(v, batch).await?;
                        v = back;
                        for c in &batch {
                            w.wait_for_capacity(4).await.map_err(storage)?;
                            w.write(c);
                        }
                    }
                    v.finish(bytes)
                }
                .await;
                match result {
                    Ok(summary) => {
                        w.finish().await.map_err(storage)?;
                        Ok(summary)
                    }
                    Err(e) => {
                        let _ = w.abort().await;
                        Err(e)
                    }
                }
            }
        }
    }

    /// Opens a stored trace as a byte stream, with its size. `None` when it does not exist.
    pub async fn get(
        &self,
        id: &TraceId,
    ) -> anyhow::Result<
        Option<(
            u64,
            std::pin::Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>,
        )>,
    > {
        match self {
            Self::Local { root, .. } => {
                let path = root.join("traces").join(format!("{id}.msgpack"));
                let f = match tokio::fs::File::open(&path).await {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e.into()),
                };
                let len = f.metadata().await?.len();
                let stream = futures_util::stream::unfold(f, |mut f| async move {
                    use tokio::io::AsyncReadExt;
                    let mut buf = vec![0u8; 256 * 1024];
                    match f.read(&mut buf).await {
                        Ok(0) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((Ok(Bytes::from(buf)), f))
                        }
                        Err(e) => Some((Err(e), f)),
                    }
                });
                Ok(Some((len, Box::pin(stream))))
            }
            Self::Object { store, prefix, .. } => {
                match store.get(&Self::object_path(prefix, id)).await {
                    Ok(r) => {
                        let len = r.meta.size;
                        let s = r.into_stream().map(|c| c.map_err(std::io::Error::other));
                        Ok(Some((len, Box::pin(s))))
                    }
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Whether a trace is stored, without reading it (a HEAD on object stores).
    pub async fn exists(&self, id: &TraceId) -> anyhow::Result<bool> {
        match self {
            Self::Local { root, .. } => Ok(tokio::fs::try_exists(
                root.join("traces").join(format!("{id}.msgpack")),
            )
            .await?),
            Self::Object { store, prefix, .. } => {
                match store.head(&Self::object_path(prefix, id)).await {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::NotFound { .. }) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Every stored trace (for retention only; never exposed over HTTP), its size with the
    /// summary kept of it.
    pub async fn list(&self) -> anyhow::Result<Vec<StoredTrace>> {
        let mut out = Vec::new();
        match self {
            Self::Local { root, .. } => {
                let mut dir = tokio::fs::read_dir(root.join("traces")).await?;
                while let Some(e) = dir.next_entry().await? {
                    let name = e.file_name();
                    let Some(id) = name
                        .to_str()
                        .and_then(|n| n.strip_suffix(".msgpack"))
                        .and_then(|n| TraceId::parse(n).ok())
                    else {
                        continue;
                    };
                    let m = e.metadata().await?;
                    let kept = root.join("summaries").join(format!("{id}.summary"));
                    let kept = tokio::fs::metadata(kept).await.map_or(0, |k| k.len());
                    out.push(StoredTrace {
                        id,
                        size_bytes: m.len().saturating_add(kept),
                        modified: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
            }
            Self::Object { store, prefix, .. } => {
                let mut kept: std::collections::HashMap<TraceId, u64> = Default::default();
                let mut s = store.list(Some(prefix));
                while let Some(meta) = s.next().await {
                    let meta = meta?;
                    let name = meta.location.filename();
                    if let Some(id) = name
                        .and_then(|n| n.strip_suffix(".summary"))
                        .and_then(|n| TraceId::parse(n).ok())
                    {
                        kept.insert(id, meta.size);
                        continue;
                    }
                    let Some(id) = name
                        .and_then(|n| n.strip_suffix(".msgpack"))
                        .and_then(|n| TraceId::parse(n).ok())
                    else {
                        continue;
                    };
                    out.push(StoredTrace {
                        id,
                        size_bytes: meta.size,
                        modified: meta.last_modified.into(),
                    });
                }
                for t in &mut out {
                    let k = kept.get(&t.id).copied().unwrap_or(0);
                    t.size_bytes = t.size_bytes.saturating_add(k);
                }
            }
        }
        Ok(out)
    }

    /// Deletes a trace and the summary kept of it. One already gone (another server sharing
    /// the store deleted it) is not an error.
    pub async fn delete(&self, id: &TraceId) -> anyhow::Result<()> {
        match self {
            Self::Local { root, .. } => {
                for path in [
                    root.join("traces").join(format!("{id}.msgpack")),
                    root.join("summaries").join(format!("{id}.summary")),
                ] {
                    match tokio::fs::remove_file(path).await {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(e.into());
                        }
                        _ => {}
                    }
                }
            }
            Self::Object { store, prefix, .. } => {
                store.delete(&Self::object_path(prefix, id)).await?;
                match store.delete(&Self::summary_path(prefix, id)).await {
                    Err(object_store::Error::NotFound { .. }) | Ok(()) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    fn summary_path(prefix: &ObjectPath, id: &TraceId) -> ObjectPath {
        prefix.child("summaries").child(format!("{id}.summary"))
    }

    /// Keeps the summary made of trace `id` (`summaries.rs`), replacing one kept before. It is
    /// visible whole or not at all: a local one is written beside and renamed into place, an
    /// object is put in one request.
    pub async fn put_summary(&self, id: &TraceId, bytes: Vec<u8>) -> anyhow::Result<()> {
        match self {
            Self::Local { root, instance } => {
                let staged = instance.dir.join(format!("{id}.summary"));
                tokio::fs::write(&staged, &bytes).await?;
                let to = root.join("summaries").join(format!("{id}.summary"));
                if let Err(e) = tokio::fs::rename(&staged, &to).await {
                    let _ = tokio::fs::remove_file(&staged).await;
                    return Err(e.into());
                }
            }
            Self::Object { store, prefix, .. } => {
                store
                    .put(&Self::summary_path(prefix, id), Bytes::from(bytes).into())
                    .await?;
            }
        }
        Ok(())
    }

    /// The summary kept of trace `id`, if any.
    pub async fn get_summary(&self, id: &TraceId) -> anyhow::Result<Option<Vec<u8>>> {
        match self {
            Self::Local { root, .. } => {
                match tokio::fs::read(root.join("summaries").join(format!("{id}.summary"))).await {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
            Self::Object { store, prefix, .. } => {
                match store.get(&Self::summary_path(prefix, id)).await {
                    Ok(r) => Ok(Some(r.bytes().await?.to_vec())),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept summary is read back as written, replaced by the next, and deleted with its
    /// trace.
    #[test]
    fn a_kept_summary_goes_with_its_trace() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let root = std::env::temp_dir().join(format!(
                "gpucollect-store-test-{}",
                TraceId::random().expect("id")
            ));
            let store = Store::local(&root).await.expect("store");
            let id = TraceId::random().expect("id");
            let trace = root.join("traces").join(format!("{id}.msgpack"));
            std::fs::write(&trace, b"trace").expect("write");
            assert_eq!(store.get_summary(&id).await.expect("read"), None);
            let listed = |l: Vec<StoredTrace>| l.iter().find(|t| t.id == id).map(|t| t.size_bytes);
            assert_eq!(listed(store.list().await.expect("list")), Some(5));
            store.put_summary(&id, b"one".to_vec()).await.expect("keep");
            store.put_summary(&id, b"two".to_vec()).await.expect("keep");
            assert_eq!(
                store.get_summary(&id).await.expect("read").as_deref(),
                Some(&b"two"[..])
            );
            // Retention counts the kept summary with its trace.
            assert_eq!(listed(store.list().await.expect("list")), Some(8));
            store.delete(&id).await.expect("delete");
            assert!(!trace.exists());
            assert_eq!(store.get_summary(&id).await.expect("read"), None);
            // Deleting again, or a trace that never had a summary, is not an error.
            store.delete(&id).await.expect("delete again");
            drop(store);
            let _ = std::fs::remove_dir_all(&root);
        });
    }
}
