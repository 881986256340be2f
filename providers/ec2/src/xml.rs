//! Reading EC2 Query API responses (XML, namespace `http://ec2.amazonaws.com/doc/2016-11-15/`;
//! element names are matched without it).

use roxmltree::{Document, Node};

use crate::instance::Instance;

#[derive(Debug, thiserror::Error)]
#[error("the EC2 response is not valid XML")]
pub struct XmlError(#[from] roxmltree::Error);

/// `<Response><Errors><Error><Code>…</Code><Message>…</Message>`: the first error.
pub fn error(body: &str) -> Option<(String, String)> {
    let doc = Document::parse(body).ok()?;
    let error = doc.descendants().find(|n| n.has_tag_name("Error"))?;
    let code = child_text(error, "Code")?;
    let message = child_text(error, "Message").unwrap_or_default();
    Some((code, message))
}

/// Every instance of a `DescribeInstances` or `RunInstances` response (each `instancesSet/item`).
pub fn instances(body: &str) -> Result<Vec<Instance>, XmlError> {
    let doc = Document::parse(body)?;
    let instances = doc
        .descendants()
        .filter(|n| n.has_tag_name("instancesSet"))
        .flat_map(|set| set.children().filter(|n| n.has_tag_name("item")))
        .map(instance)
        .filter(|i| !i.id.is_empty())
        .collect();
    Ok(instances)
}

/// The `imageId`s of a `DescribeImages` response.
pub fn image_ids(body: &str) -> Result<Vec<String>, XmlError> {
    let doc = Document::parse(body)?;
    let ids = doc
        .descendants()
        .filter(|n| n.has_tag_name("imagesSet"))
        .flat_map(|set| set.children().filter(|n| n.has_tag_name("item")))
        .filter_map(|item| child_text(item, "imageId"))
        .collect();
    Ok(ids)
}

fn instance(item: Node<'_, '_>) -> Instance {
    let text = |name| child_text(item, name);
    Instance {
        id: text("instanceId").unwrap_or_default(),
        state: child(item, "instanceState")
            .and_then(|s| child_text(s, "name"))
            .unwrap_or_default(),
        public_ip: text("ipAddress"),
        private_ip: text("privateIpAddress"),
        public_dns: text("dnsName"),
        private_dns: text("privateDnsName"),
        state_reason: child(item, "stateReason").and_then(|s| child_text(s, "message")),
        launch_time: text("launchTime").unwrap_or_default(),
    }
}

fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children().find(|n| n.has_tag_name(name))
}

fn child_text(node: Node<'_, '_>, name: &str) -> Option<String> {
    child(node, name)
        .and_then(|n| n.text())
        .map(|t| t.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESCRIBE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>r-1</requestId>
  <reservationSet>
    <item>
      <reservationId>r-0a</reservationId>
      <instancesSet>
        <item>
          <instanceId>i-0123</instanceId>
          <imageId>ami-12c6146b</imageId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName>ip-10-0-0-5.ec2.internal</privateDnsName>
          <dnsName></dnsName>
          <launchTime>2026-11-29T21:00:00.000Z</launchTime>
          <privateIpAddress>10.0.0.5</privateIpAddress>
          <ipAddress>54.1.2.3</ipAddress>
          <stateReason><code>0</code><message>fine</message></stateReason>
          <tagSet><item><key>vmop.dev/uid</key><value>u-1</value></item></tagSet>
          <networkInterfaceSet><item><privateIpAddress>10.9.9.9</privateIpAddress></item></networkInterfaceSet>
        </item>
      </instancesSet>
    </item>
    <item>
      <instancesSet>
        <item>
          <instanceId>i-0456</instanceId>
          <instanceState><code>48</code><name>terminated</name></instanceState>
        </item>
      </instancesSet>
    </item>
  </reservationSet>
</DescribeInstancesResponse>"#;

    #[test]
    fn reads_instances_across_reservations() {
        let all = instances(DESCRIBE).unwrap();
        assert_eq!(all.len(), 2);
        let first = &all[0];
        assert_eq!(first.id, "i-0123");
        assert_eq!(first.state, "running");
        assert_eq!(first.public_ip.as_deref(), Some("54.1.2.3"));
        // The instance's own address, not the one of a nested network interface.
        assert_eq!(first.private_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(first.public_dns, None);
        assert_eq!(first.state_reason.as_deref(), Some("fine"));
        assert_eq!(first.launch_time, "2026-11-29T21:00:00.000Z");
        assert_eq!(all[1].state, "terminated");
    }

    #[test]
    fn reads_errors() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>InvalidAMIID.NotFound</Code><Message>The image id '[ami-x]' does not exist</Message></Error></Errors><RequestID>x</RequestID></Response>"#;
        let (code, message) = error(body).unwrap();
        assert_eq!(code, "InvalidAMIID.NotFound");
        assert!(message.contains("ami-x"));
        assert_eq!(error("not xml"), None);
        assert_eq!(error("<Response/>"), None);
    }

    #[test]
    fn reads_image_ids() {
        let body = r#"<DescribeImagesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
<imagesSet><item><imageId>ami-1</imageId></item><item><imageId>ami-2</imageId></item></imagesSet>
</DescribeImagesResponse>"#;
        assert_eq!(image_ids(body).unwrap(), ["ami-1", "ami-2"]);
        assert!(image_ids("<x").is_err());
    }
}
