//! Bounds on what one API answer may cost, and the tower layer that holds every request of the
//! client to them: list answers capped in bytes, items and time; watch lines capped and watch
//! starts paced.

use std::time::Duration;

/// Bounds on what one API answer may cost: an endless or huge list must not grow the agent
/// without end, nor a hanging server stall discovery in silence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApiBounds {
    /// The most bytes one list answer may hold (the watcher lists in pages of 500 pods, a few
    /// MB; kube-apiserver never sends more).
    pub max_list_bytes: u64,
    /// How long one list may take, headers to last byte.
    pub list_deadline: Duration,
    /// How long without a complete pod list before a warning (repeated at this period).
    pub warn_after: Duration,
    /// The most bytes one watch event (one line of a watch answer) may hold: a pod is at most
    /// ~1.5 MB (etcd's request limit), so a longer line is a broken or hostile server, and
    /// kube-rs would buffer it without end.
    pub max_watch_line_bytes: u64,
    /// The least time between the starts of two watches: kube-rs starts a watch again at once,
    /// without backoff, when the server ends one cleanly, so a server that ends each at once
    /// would be asked again in a busy loop.
    pub min_watch_interval: Duration,
    /// The `timeoutSeconds` the watchers ask for: the server ends each watch by then, so a
    /// watch still open [`ApiBounds::watch_margin`] later hangs (kube-rs alone would notice
    /// only ~5 min in, unsaid).
    pub watch_timeout: Duration,
    /// How long past its `timeoutSeconds` a watch may stay open before it is cut (below
    /// kube-rs's own 5 s idle margin, so the cut is ours and said).
    pub watch_margin: Duration,
    /// The most items one list answer may hold. kube-rs parses a whole page into typed objects
    /// of a few kB each however short their JSON (`{}` is 3 bytes), so the byte cap alone let
    /// a 64 MiB answer of empty items cost tens of GB. The watchers ask pages of 500, and a
    /// node runs a few hundred pods (kube-apiserver serving from its cache may send them all).
    pub max_list_items: u64,
    /// The most JSON strings (keys and values) one list answer may hold. Each costs two heap
    /// objects once parsed (~60 bytes and more), so a few items can be deep: one pod of 64 MiB
    /// of `"k":"v",` annotations parsed to ~1 GB (docs/kubernetes.md has the figures). A real
    /// pod holds a few hundred strings (managedFields included), and the watchers ask pages of
    /// 500: 2 Mi is ~4000 a pod.
    pub max_list_strings: u64,
    /// The most JSON strings one watch event (one line) may hold, for the same reason as
    /// [`ApiBounds::max_list_strings`]: a 16 MiB line of `"k":"v",` is ~4 Mi strings, parsed to
    /// ~250 MB. A pod is at most ~1.5 MB (etcd's request limit) and a string takes 4 bytes at
    /// the least (`"",` with its key's), so no pod etcd stores holds 512 Ki.
    pub max_watch_event_strings: u64,
}

impl Default for ApiBounds {
    fn default() -> ApiBounds {
        ApiBounds {
            max_list_bytes: 64 << 20,
            list_deadline: Duration::from_secs(60),
            warn_after: Duration::from_secs(10),
            max_watch_line_bytes: 16 << 20,
            min_watch_interval: Duration::from_secs(1),
            watch_timeout: Duration::from_secs(60),
            watch_margin: Duration::from_secs(3),
            max_list_items: crate::state::MAX_PODS as u64,
            max_list_strings: 2 << 20,
            max_watch_event_strings: 512 << 10,
        }
    }
}

/// Why a list answer was cut.
#[derive(Debug, thiserror::Error)]
pub enum ListBoundError {
    #[error("the API server's list answer passed the cap of {cap} bytes (a page of 500 pods is a few MB: a broken or hostile API server); cut, retried with backoff")]
    TooLarge { cap: u64 },
    #[error("the API server did not finish {what} within its {secs} s deadline (hanging or overloaded); cut, retried with backoff")]
    Deadline { what: String, secs: u64 },
    #[error("one event of the API server's watch passed the cap of {cap} bytes without a line end (a pod is at most ~1.5 MB: a broken or hostile API server); cut, watched again with backoff")]
    WatchLineTooLarge { cap: u64 },
    #[error("one event of the API server's watch passed the cap of {cap} JSON strings (a pod holds a few hundred, and none etcd stores holds this many: a broken or hostile API server); cut, watched again with backoff")]
    WatchEventTooManyStrings { cap: u64 },
    #[error("the API server kept a watch open past its timeoutSeconds ({timeout_s} s) by {margin_s} s (hanging, or a proxy holding it); cut, watched again with backoff")]
    WatchOverdue { timeout_s: u64, margin_s: u64 },
    #[error("the API server's list answer passed the cap of {cap} items (pages of 500 are asked, and a node runs a few hundred pods: a broken or hostile API server); cut, retried with backoff")]
    TooManyItems { cap: u64 },
    #[error("the API server's list answer passed the cap of {cap} JSON strings (a pod holds a few hundred: a broken or hostile API server); cut, retried with backoff")]
    TooManyStrings { cap: u64 },
    #[error("the API server answered {status} (a redirect to {location}), which is not followed: point the kubeconfig's server at the API server itself")]
    Redirect { status: u16, location: String },
}

/// The tower layer that bounds list answers (a watch streams for minutes: only its line length is
/// capped, and its starts paced).
pub(crate) mod bounded {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response};
    use http_body::{Body, Frame, SizeHint};
    use kube::client::Body as KubeBody;
    use tower::BoxError;

    use super::{ApiBounds, ListBoundError};

    pub struct BoundLayer {
        bounds: ApiBounds,
        pace: Arc<Mutex<Pace>>,
    }

    impl BoundLayer {
        pub fn new(bounds: ApiBounds) -> BoundLayer {
            BoundLayer {
                bounds,
                pace: Arc::default(),
            }
        }
    }

    impl<S> tower::Layer<S> for BoundLayer {
        type Service = Bound<S>;
        fn layer(&self, inner: S) -> Bound<S> {
            Bound {
                inner,
                bounds: self.bounds,
                pace: self.pace.clone(),
            }
        }
    }

    pub struct Bound<S> {
        inner: S,
        bounds: ApiBounds,
        pace: Arc<Mutex<Pace>>,
    }

    /// When the last watch started, and whether pacing was said since watches last ran long.
    #[derive(Default)]
    pub struct Pace {
        last_start: Option<tokio::time::Instant>,
        paced: u64,
        said: bool,
    }

    /// A watch that started this long after the previous one means watches run normally again:
    /// the next run of watches ended at once is said again.
    const PACE_RESAY_AFTER: Duration = Duration::from_secs(60);

    impl Pace {
        /// How long to hold back a watch starting at `now` (and says the first hold-back of a
        /// run of them, once).
        fn hold(&mut self, now: tokio::time::Instant, min: Duration) -> Duration {
            let wait = match self.last_start {
                Some(last) => (last + min).saturating_duration_since(now),
                None => Duration::ZERO,
            };
            if let Some(last) = self.last_start {
                if now.saturating_duration_since(last) >= PACE_RESAY_AFTER {
                    self.said = false;
                }
            }
            self.last_start = Some(now + wait);
            if !wait.is_zero() {
                self.paced += 1;
                if !self.said {
                    self.said = true;
                    tracing::warn!(
                        paced = self.paced,
                        "kubernetes: the API server ended a watch less than {} ms after it began; \
                         watches are started at most once every {} ms (said once until watches \
                         run long again)",
                        min.as_millis(),
                        min.as_millis()
                    );
                }
            }
            wait
        }
    }

    /// A watch request's `timeoutSeconds`.
    fn watch_timeout_s(req: &Request<KubeBody>) -> Option<u64> {
        req.uri().query()?.split('&').find_map(|kv| {
            kv.strip_prefix("timeoutSeconds=")
                .and_then(|v| v.parse().ok())
        })
    }

    /// What a request bounded by the deadline is, for its error: every request but a watch is
    /// cut at it, the publisher's status patch too.
    fn what(req: &Request<KubeBody>) -> String {
        let path = req.uri().path();
        let node_status = path
            .strip_prefix("/api/v1/nodes/")
            .and_then(|p| p.strip_suffix("/status"))
            .filter(|n| !n.contains('/'));
        match (req.method(), node_status) {
            (&http::Method::GET, _) => "a list answer".into(),
            (&http::Method::PATCH, Some(node)) => {
                format!("the patch of Node {}'s status", crate::pod::escaped(node))
            }
            (m, _) => format!("the answer to {m} {}", crate::pod::escaped(path)),
        }
    }

    fn is_watch(req: &Request<KubeBody>) -> bool {
        req.uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
    }

    impl<S, B> tower::Service<Request<KubeBody>> for Bound<S>
    where
        S: tower::Service<Request<KubeBody>, Response = Response<B>>,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        type Response = Response<Capped<B>>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            self.inner.poll_ready(cx).map_err(Into::into)
        }

        fn call(&mut self, req: Request<KubeBody>) -> Self::Future {
            let watch = is_watch(&req);
            let bounds = (!watch).then_some(self.bounds);
            let what = what(&req);
            let hold = if watch {
                let mut pace = self.pace.lock().unwrap_or_else(|p| p.into_inner());
                pace.hold(tokio::time::Instant::now(), self.bounds.min_watch_interval)
            } else {
                Duration::ZERO
            };
            let max_line = (
                self.bounds.max_watch_line_bytes,
                self.bounds.max_watch_event_strings,
            );
            // The server ends a watch by its timeoutSeconds (kube-rs's default when absent).
            let timeout_s = watch_timeout_s(&req).unwrap_or(290);
            let margin = self.bounds.watch_margin;
            let fut = self.inner.call(req);
            Box::pin(async move {
                let Some(b) = bounds else {
                    // hyper's request future is lazy: holding it back holds the request
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    let overdue =
                        tokio::time::Instant::now() + Duration::from_secs(timeout_s) + margin;
                    let resp = redirect_refused(fut.await.map_err(Into::into)?)?;
                    let over = (overdue, timeout_s, margin.as_secs());
                    return Ok(resp.map(|body| Capped::watch(body, max_line, over)));
                };
                let deadline = tokio::time::Instant::now() + b.list_deadline;
                let resp = match tokio::time::timeout_at(deadline, fut).await {
                    Ok(r) => redirect_refused(r.map_err(Into::into)?)?,
                    Err(_) => {
                        return Err(ListBoundError::Deadline {
                            what,
                            secs: b.list_deadline.as_secs(),
                        }
                        .into())
                    }
                };
                Ok(resp.map(|body| Capped::new(body, Some((b, what)), Some(deadline))))
            })
        }
    }

    /// A redirect is not followed (it could lead the client's credentials elsewhere), and
    /// kube-rs read its empty body as JSON: "EOF while parsing a value". It is said as one.
    fn redirect_refused<B>(resp: Response<B>) -> Result<Response<B>, BoxError> {
        if !resp.status().is_redirection() {
            return Ok(resp);
        }
        let location = resp
            .headers()
            .get(http::header::LOCATION)
            .map(|l| crate::pod::shown(&String::from_utf8_lossy(l.as_bytes())))
            .unwrap_or_else(|| "nowhere said".into());
        Err(ListBoundError::Redirect {
            status: resp.status().as_u16(),
            location,
        }
        .into())
    }

    /// A response body cut at a byte cap and a deadline (a list), or at a line length (a
    /// watch: one event per line). After an error it ends.
    pub struct Capped<B> {
        inner: Pin<Box<B>>,
        read: u64,
        bounds: Option<ApiBounds>,
        /// What the request is, for the deadline's error.
        what: String,
        deadline: Option<Pin<Box<tokio::time::Sleep>>>,
        /// A watch's cap on one line, and the bytes since the last line end.
        max_line: Option<u64>,
        line: u64,
        /// A watch's cap on the strings of one line (one event), and the strings of this line.
        max_line_strings: Option<u64>,
        event: ItemCount,
        /// A watch's end at the latest: its timeoutSeconds and margin passed.
        overdue: Option<(Pin<Box<tokio::time::Sleep>>, u64, u64)>,
        /// A list's items counted so far, as its bytes go by.
        items: ItemCount,
        failed: bool,
    }

    /// Counts the objects of a list answer's top-level array (`items`) as its bytes stream by,
    /// without parsing: strings are skipped (escapes included), and an object opened directly
    /// inside an array that is a field of the top-level object is one item.
    #[derive(Default)]
    pub struct ItemCount {
        depth: u32,
        /// Whether the container open at depth 2 is an array.
        array_at_2: bool,
        in_string: bool,
        escaped: bool,
        pub items: u64,
        /// Strings begun (keys and values), anywhere in the answer.
        pub strings: u64,
    }

    impl ItemCount {
        pub fn feed(&mut self, data: &[u8]) {
            for &c in data {
                if self.in_string {
                    if self.escaped {
                        self.escaped = false;
                    } else if c == b'\\' {
                        self.escaped = true;
                    } else if c == b'"' {
                        self.in_string = false;
                    }
                    continue;
                }
                match c {
                    b'"' => {
                        self.in_string = true;
                        self.strings += 1;
                    }
                    b'{' | b'[' => {
                        if self.depth == 1 {
                            self.array_at_2 = c == b'[';
                        } else if self.depth == 2 && self.array_at_2 && c == b'{' {
                            self.items += 1;
                        }
                        self.depth = self.depth.saturating_add(1);
                    }
                    b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                    _ => {}
                }
            }
        }
    }

    impl<B> Capped<B> {
        fn new(
            body: B,
            bounds: Option<(ApiBounds, String)>,
            deadline: Option<tokio::time::Instant>,
        ) -> Capped<B> {
            let (bounds, what) = bounds.unzip();
            Capped {
                inner: Box::pin(body),
                read: 0,
                bounds,
                what: what.unwrap_or_default(),
                deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
                max_line: None,
                line: 0,
                max_line_strings: None,
                event: ItemCount::default(),
                overdue: None,
                items: ItemCount::default(),
                failed: false,
            }
        }

        fn watch(
            body: B,
            (max_line, max_line_strings): (u64, u64),
            (at, timeout_s, margin_s): (tokio::time::Instant, u64, u64),
        ) -> Capped<B> {
            Capped {
                max_line: Some(max_line),
                max_line_strings: Some(max_line_strings),
                overdue: Some((Box::pin(tokio::time::sleep_until(at)), timeout_s, margin_s)),
                ..Capped::new(body, None, None)
            }
        }

        fn fail(&mut self, e: ListBoundError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.failed = true;
            Poll::Ready(Some(Err(e.into())))
        }
    }

    impl<B> Body for Capped<B>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            let this = self.get_mut();
            if this.failed {
                return Poll::Ready(None);
            }
            if let (Some(d), Some(b)) = (this.deadline.as_mut(), this.bounds) {
                if d.as_mut().poll(cx).is_ready() {
                    let secs = b.list_deadline.as_secs();
                    let what = std::mem::take(&mut this.what);
                    return this.fail(ListBoundError::Deadline { what, secs });
                }
            }
            if let Some((d, timeout_s, margin_s)) = this.overdue.as_mut() {
                if d.as_mut().poll(cx).is_ready() {
                    let (timeout_s, margin_s) = (*timeout_s, *margin_s);
                    return this.fail(ListBoundError::WatchOverdue {
                        timeout_s,
                        margin_s,
                    });
                }
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let (Some(b), Some(data)) = (this.bounds, frame.data_ref()) {
                        this.read += data.len() as u64;
                        if this.read > b.max_list_bytes {
                            let cap = b.max_list_bytes;
                            return this.fail(ListBoundError::TooLarge { cap });
                        }
                        this.items.feed(data);
                        if this.items.items > b.max_list_items {
                            let cap = b.max_list_items;
                            return this.fail(ListBoundError::TooManyItems { cap });
                        }
                        if this.items.strings > b.max_list_strings {
                            let cap = b.max_list_strings;
                            return this.fail(ListBoundError::TooManyStrings { cap });
                        }
                    }
                    if let (Some(cap), Some(data)) = (this.max_line, frame.data_ref()) {
                        this.line = match data.iter().rposition(|&c| c == b'\n') {
                            Some(i) => (data.len() - i - 1) as u64,
                            None => this.line + data.len() as u64,
                        };
                        if this.line > cap {
                            return this.fail(ListBoundError::WatchLineTooLarge { cap });
                        }
                    }
                    if let (Some(cap), Some(data)) = (this.max_line_strings, frame.data_ref()) {
                        // Events are lines (a string holds no raw line end): counted per line.
                        for part in data.split_inclusive(|&c| c == b'\n') {
                            this.event.feed(part);
                            if this.event.strings > cap {
                                return this.fail(ListBoundError::WatchEventTooManyStrings { cap });
                            }
                            if part.last() == Some(&b'\n') {
                                this.event = ItemCount::default();
                            }
                        }
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        }

        fn is_end_stream(&self) -> bool {
            self.failed || self.inner.is_end_stream()
        }

        fn size_hint(&self) -> SizeHint {
            self.inner.size_hint()
        }
    }
}
