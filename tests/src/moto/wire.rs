//! The little HTTP and XML this harness needs to talk to moto itself (not the code under test):
//! one HTTP/1.0 request per connection, form-encoded Query API bodies, flat XML elements.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

/// Every request of this module, as a bound against a wedged server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A Query API request for `service`. Its `Authorization` header only routes the request inside
/// moto: the signature is a placeholder, accepted only while moto does not authenticate.
pub fn query_request(
    port: u16,
    service: &str,
    version: &str,
    action: &str,
    params: &[(&str, &str)],
) -> String {
    let form = [("Action", action), ("Version", version)]
        .iter()
        .chain(params)
        .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    format!(
        "POST / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/x-www-form-urlencoded; charset=utf-8\r\n\
         X-Amz-Date: 20260101T000000Z\r\n\
         Authorization: AWS4-HMAC-SHA256 \
         Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/{service}/aws4_request, \
         SignedHeaders=host;x-amz-date, Signature=00\r\n\
         Content-Length: {len}\r\n\r\n{form}",
        len = form.len(),
    )
}

/// One HTTP/1.0 exchange (so the answer is neither chunked nor kept alive): status and body.
pub fn exchange(port: u16, request: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response"))?;
    Ok((status, body.to_owned()))
}

fn form_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of every `<name>…</name>` in `xml` (flat elements only; enough for moto's answers).
pub fn all_elements(xml: &str, name: &str) -> Vec<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut found = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = rest.get(start + open.len()..).unwrap_or_default();
        let Some(end) = after.find(&close) else { break };
        found.push(after.get(..end).unwrap_or_default().trim().to_owned());
        rest = after.get(end + close.len()..).unwrap_or_default();
    }
    found
}

pub fn first_element(xml: &str, name: &str) -> Option<String> {
    all_elements(xml, name).into_iter().next()
}

/// The first `<child>` after the first `<parent>`.
pub fn element_after(xml: &str, parent: &str, child: &str) -> Option<String> {
    let start = xml.find(&format!("<{parent}>"))?;
    first_element(xml.get(start..)?, child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_elements() {
        let xml = "<a><instanceId>i-1</instanceId><x/><instanceId> i-2 </instanceId></a>";
        assert_eq!(all_elements(xml, "instanceId"), ["i-1", "i-2"]);
        let state = "<instanceState><code>16</code><name>running</name></instanceState>";
        assert_eq!(
            element_after(&format!("<name>x</name>{state}"), "instanceState", "name").as_deref(),
            Some("running")
        );
        assert_eq!(first_element(xml, "missing"), None);
    }

    #[test]
    fn encodes_forms() {
        assert_eq!(form_encode(r#"{"a":"b c"}"#), "%7B%22a%22%3A%22b%20c%22%7D");
    }

    #[test]
    fn query_requests_route_to_the_service() {
        let request = query_request(5, "iam", "2010-05-08", "CreateUser", &[("UserName", "a b")]);
        assert!(request.contains("/us-east-1/iam/aws4_request"), "{request}");
        let form = "Action=CreateUser&Version=2010-05-08&UserName=a%20b";
        assert!(request.ends_with(form), "{request}");
        assert!(
            request.contains(&format!("Content-Length: {}\r\n", form.len())),
            "{request}"
        );
    }
}
