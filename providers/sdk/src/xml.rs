//! Reading XML answers (feature `xml`, on `roxmltree`): the few lookups a Query-style API's
//! provider repeats. Element names are matched without their namespace, since clouds vary the
//! namespace by API version.

pub use roxmltree::{Document, Node};

/// A body that is not well-formed XML.
#[derive(Debug, thiserror::Error)]
#[error("the response is not valid XML")]
pub struct XmlError(#[from] roxmltree::Error);

/// Parses `body`.
pub fn parse(body: &str) -> Result<Document<'_>, XmlError> {
    Ok(Document::parse(body)?)
}

/// The first child element of `node` named `name`.
pub fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children().find(|n| n.has_tag_name(name))
}

/// The trimmed text of the first child element named `name`.
pub fn child_text(node: Node<'_, '_>, name: &str) -> Option<String> {
    child(node, name)
        .and_then(|n| n.text())
        .map(|t| t.trim().to_owned())
}

/// The `item` children of every element named `set` (`instancesSet/item`, ...), in document
/// order: how Query APIs spell a list.
pub fn items<'a, 'i>(doc: &'a Document<'i>, set: &'a str) -> impl Iterator<Item = Node<'a, 'i>> {
    doc.descendants()
        .filter(move |n| n.has_tag_name(set))
        .flat_map(|s| s.children().filter(|n| n.has_tag_name("item")))
}

/// `(Code, Message)` of the first `Error` element, as AWS-style APIs report failures; `None`
/// for a body that is not XML or has no error code.
pub fn error_code(body: &str) -> Option<(String, String)> {
    let doc = Document::parse(body).ok()?;
    let error = doc.descendants().find(|n| n.has_tag_name("Error"))?;
    let code = child_text(error, "Code")?;
    Some((code, child_text(error, "Message").unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_items_text_and_errors() {
        let body = r#"<R xmlns="urn:x"><instancesSet><item><id> a </id></item><item><id>b</id></item></instancesSet></R>"#;
        let doc = parse(body).unwrap();
        let ids: Vec<String> = items(&doc, "instancesSet")
            .filter_map(|i| child_text(i, "id"))
            .collect();
        assert_eq!(ids, ["a", "b"]);
        let error = "<Response><Errors><Error><Code>Throttling</Code><Message>slow</Message></Error></Errors></Response>";
        assert_eq!(
            error_code(error),
            Some(("Throttling".into(), "slow".into()))
        );
        assert_eq!(error_code("not xml"), None);
        assert!(parse("<x").is_err());
    }
}
