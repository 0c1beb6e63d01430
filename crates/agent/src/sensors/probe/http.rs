//! Framing the HTTP/1.1 replies the prober reads.

/// A reply the prober cannot frame as HTTP/1.1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpFramingError {
    #[error("HTTP header longer than 64 KiB")]
    HeaderTooLong,
    #[error("not an HTTP/1.x response: {status:?}")]
    NotHttp { status: String },
    #[error("bad Content-Length {value:?}")]
    BadContentLength { value: String },
    #[error("chunked HTTP responses are not supported by the prober")]
    Chunked,
}

/// The length of one complete HTTP/1.1 response at the start of `buf` (`Content-Length` bodies
/// and bodiless statuses); `Ok(None)` = need more bytes.
pub fn parse_http_response(buf: &[u8]) -> Result<Option<usize>, HttpFramingError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > 64 * 1024 {
            return Err(HttpFramingError::HeaderTooLong);
        }
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    if !status.starts_with("HTTP/1.") {
        return Err(HttpFramingError::NotHttp {
            status: status.to_string(),
        });
    }
    let mut length = 0usize;
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            if k == "content-length" {
                length = v
                    .trim()
                    .parse()
                    .map_err(|_| HttpFramingError::BadContentLength {
                        value: v.trim().to_string(),
                    })?;
            } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                return Err(HttpFramingError::Chunked);
            }
        }
    }
    let total = end + 4 + length;
    Ok((buf.len() >= total).then_some(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_responses_are_framed() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1";
        assert_eq!(parse_http_response(r).unwrap(), Some(40));
        assert_eq!(parse_http_response(&r[..30]).unwrap(), None);
        assert!(matches!(
            parse_http_response(b"SSH-2.0\r\n\r\n"),
            Err(HttpFramingError::NotHttp { .. })
        ));
        assert_eq!(
            parse_http_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
            Err(HttpFramingError::BadContentLength { value: "x".into() })
        );
    }
}
