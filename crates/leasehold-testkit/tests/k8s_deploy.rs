//! The Kubernetes deployment files grant exactly the verbs the Lease store uses and give pods
//! their identity through the downward API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

fn read(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn role_grants_exactly_the_verbs_on_leases() {
    let rbac = read("rbac.yaml");
    for kind in ["kind: ServiceAccount", "kind: Role", "kind: RoleBinding"] {
        assert!(rbac.contains(kind), "{kind}");
    }
    assert!(!rbac.contains("ClusterRole"), "namespaced only");
    let verbs: Vec<&str> = rbac
        .lines()
        .filter(|l| l.trim_start().starts_with("verbs:"))
        .collect();
    assert_eq!(
        verbs,
        ["    verbs: [\"get\", \"list\", \"watch\", \"create\", \"update\", \"delete\"]"]
    );
    assert!(rbac.contains("apiGroups: [\"coordination.k8s.io\"]"));
    assert!(rbac.contains("resources: [\"leases\"]"));
}

#[test]
fn deployment_sets_pod_name_and_namespace_from_the_downward_api() {
    let d = read("deployment.yaml");
    for (var, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let at = d
            .find(&format!("name: {var}\n"))
            .unwrap_or_else(|| panic!("{var}"));
        assert!(d[at..].contains(&format!("fieldPath: {path}")), "{var}");
    }
    assert!(d.contains("serviceAccountName: leasehold"));
    assert!(d.contains("k8s://"));
}
