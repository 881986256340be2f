//! Reading EC2 Query API responses (XML, namespace `http://ec2.amazonaws.com/doc/2016-11-15/`)
//! and STS's `GetCallerIdentity`; element names are matched without their namespace.

use roxmltree::{Document, Node};
use vmop_provider_sdk::tags::{TAG_CLUSTER, TAG_UID};

use crate::instance::Instance;

#[derive(Debug, thiserror::Error)]
#[error("the response is not valid XML")]
pub struct XmlError(#[from] roxmltree::Error);

/// One entry of a `DescribeImages` response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub id: String,
    /// `rootDeviceName`, e.g. `/dev/xvda`: the device a root-volume size applies to, which
    /// differs between images.
    pub root_device_name: Option<String>,
}

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
    Ok(instance_page(body)?.0)
}

/// The instances of one `DescribeInstances` page and its `nextToken` (`None` on the last page,
/// where EC2 leaves it out or empty).
pub fn instance_page(body: &str) -> Result<(Vec<Instance>, Option<String>), XmlError> {
    let doc = Document::parse(body)?;
    let instances = doc
        .descendants()
        .filter(|n| n.has_tag_name("instancesSet"))
        .flat_map(|set| set.children().filter(|n| n.has_tag_name("item")))
        .map(instance)
        .filter(|i| !i.id.is_empty())
        .collect();
    let next = child_text(doc.root_element(), "nextToken").filter(|t| !t.is_empty());
    Ok((instances, next))
}

/// The images of a `DescribeImages` response.
pub fn images(body: &str) -> Result<Vec<Image>, XmlError> {
    let doc = Document::parse(body)?;
    let images = doc
        .descendants()
        .filter(|n| n.has_tag_name("imagesSet"))
        .flat_map(|set| set.children().filter(|n| n.has_tag_name("item")))
        .filter_map(|item| {
            Some(Image {
                id: child_text(item, "imageId")?,
                root_device_name: child_text(item, "rootDeviceName").filter(|d| !d.is_empty()),
            })
        })
        .collect();
    Ok(images)
}

/// `GetCallerIdentityResult/Account` of an STS `GetCallerIdentity` response.
pub fn caller_account(body: &str) -> Result<Option<String>, XmlError> {
    let doc = Document::parse(body)?;
    Ok(doc
        .descendants()
        .find(|n| n.has_tag_name("GetCallerIdentityResult"))
        .and_then(|result| child_text(result, "Account"))
        .filter(|a| !a.is_empty()))
}

fn instance(item: Node<'_, '_>) -> Instance {
    let text = |name| child_text(item, name);
    Instance {
        id: text("instanceId").unwrap_or_default(),
        state: child(item, "instanceState")
            .and_then(|s| child_text(s, "name"))
            .unwrap_or_default(),
        instance_type: text("instanceType").unwrap_or_default(),
        public_ip: text("ipAddress"),
        private_ip: text("privateIpAddress"),
        public_dns: text("dnsName"),
        private_dns: text("privateDnsName"),
        state_reason: child(item, "stateReason").and_then(|s| child_text(s, "message")),
        launch_time: text("launchTime").unwrap_or_default(),
        owner: tag(item, TAG_UID),
        cluster: tag(item, TAG_CLUSTER),
    }
}

/// The value of tag `key` of an instance item (`tagSet/item`).
fn tag(item: Node<'_, '_>, key: &str) -> Option<String> {
    child(item, "tagSet").and_then(|set| {
        set.children()
            .filter(|n| n.has_tag_name("item"))
            .find(|tag| child_text(*tag, "key").as_deref() == Some(key))
            .map(|tag| child_text(tag, "value").unwrap_or_default())
    })
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
          <instanceType>t3.micro</instanceType>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName>ip-10-0-0-5.ec2.internal</privateDnsName>
          <dnsName></dnsName>
          <launchTime>2026-11-29T21:00:00.000Z</launchTime>
          <privateIpAddress>10.0.0.5</privateIpAddress>
          <ipAddress>54.1.2.3</ipAddress>
          <stateReason><code>0</code><message>fine</message></stateReason>
          <tagSet><item><key>vmop.dev/uid</key><value>u-1</value></item><item><key>vmop.dev/cluster</key><value>c-1</value></item></tagSet>
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
  <nextToken>r-0b</nextToken>
</DescribeInstancesResponse>"#;

    #[test]
    fn reads_instances_across_reservations() {
        let all = instances(DESCRIBE).unwrap();
        assert_eq!(all.len(), 2);
        let first = &all[0];
        assert_eq!(first.id, "i-0123");
        assert_eq!(first.state, "running");
        assert_eq!(first.instance_type, "t3.micro");
        assert_eq!(first.public_ip.as_deref(), Some("54.1.2.3"));
        // The instance's own address, not the one of a nested network interface.
        assert_eq!(first.private_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(first.public_dns, None);
        assert_eq!(first.state_reason.as_deref(), Some("fine"));
        assert_eq!(first.launch_time, "2026-11-29T21:00:00.000Z");
        assert_eq!(first.owner.as_deref(), Some("u-1"));
        assert_eq!(first.cluster.as_deref(), Some("c-1"));
        assert_eq!(all[1].state, "terminated");
        assert_eq!(all[1].owner, None);
        assert_eq!(all[1].cluster, None);
    }

    #[test]
    fn reads_the_next_token_of_the_response_only() {
        let (all, next) = instance_page(DESCRIBE).unwrap();
        assert_eq!((all.len(), next.as_deref()), (2, Some("r-0b")));
        let last = r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
<reservationSet><item><instancesSet><item><instanceId>i-1</instanceId><nextToken>inner</nextToken>
</item></instancesSet></item></reservationSet><nextToken/></DescribeInstancesResponse>"#;
        let (all, next) = instance_page(last).unwrap();
        assert_eq!((all.len(), next), (1, None));
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
    fn reads_images() {
        // Abridged from moto 5.2: the mapping's own deviceName must not be taken for the root's.
        let body = r#"<DescribeImagesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
<imagesSet><item><blockDeviceMapping><item><deviceName>/dev/sdb</deviceName></item></blockDeviceMapping>
<rootDeviceName>/dev/sda1</rootDeviceName><imageId>ami-1</imageId></item>
<item><imageId>ami-2</imageId></item></imagesSet>
</DescribeImagesResponse>"#;
        let images = images(body).unwrap();
        assert_eq!(
            images,
            [
                Image {
                    id: "ami-1".into(),
                    root_device_name: Some("/dev/sda1".into())
                },
                Image {
                    id: "ami-2".into(),
                    root_device_name: None
                }
            ]
        );
        assert!(super::images("<x").is_err());
    }

    #[test]
    fn reads_the_caller_account() {
        // As moto 5.2 answers it.
        let body = r#"<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult><UserId>AKIAIOSFODNN7EXAMPLE</UserId><Account>123456789012</Account><Arn>arn:aws:sts::123456789012:user/moto</Arn></GetCallerIdentityResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></GetCallerIdentityResponse>"#;
        assert_eq!(
            caller_account(body).unwrap().as_deref(),
            Some("123456789012")
        );
        assert_eq!(
            caller_account("<GetCallerIdentityResponse/>").unwrap(),
            None
        );
        let sts_error = r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>InvalidClientTokenId</Code><Message>bad</Message></Error></ErrorResponse>"#;
        assert_eq!(
            error(sts_error),
            Some(("InvalidClientTokenId".into(), "bad".into()))
        );
    }
}
