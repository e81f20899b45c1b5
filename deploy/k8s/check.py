"""The Kubernetes manifests, checked offline (`make k8s-check`, and `make test`).

Usage: python check.py <kubectl> <kubernetes-validate>

Each overlay is rendered with `kubectl kustomize` and every object validated strictly (unknown
fields are errors) against the schemas of the oldest Kubernetes release still supported and of
the newest. Then what the schemas cannot know: every TANDEM_* variable and every flag the pods
pass is one tandem has (the README's configuration table, which a test holds to the code), the
readiness and startup probes ask /health on the port the server listens on (liveness only
that it accepts connections: /health is 503 during a store outage and on a drained node), and the preStop hooks run `tandem nodes
drain`, a command the binary has.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "..", "README.md")
VERSIONS = ["1.30", "1.37"]
OVERLAYS = ["single-node", "cluster"]


def main():
    kubectl, validate = sys.argv[1], sys.argv[2]
    table = open(README).read()
    known_env = set(re.findall(r"`(TANDEM_[A-Z0-9_]+)`", table))
    known_flags = set(re.findall(r"\| `(--[a-z0-9-]+)`", table))
    failures = []
    for overlay in OVERLAYS:
        rendered = subprocess.run([kubectl, "kustomize", os.path.join(HERE, overlay)], check=True,
                                  capture_output=True, text=True).stdout
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tandem-k8s-{overlay}.yaml")
        with open(path, "w") as f:
            f.write(rendered)
        for version in VERSIONS:
            r = subprocess.run([validate, "--strict", "--quiet", "-k", version, path], capture_output=True, text=True)
            if r.returncode != 0 or "ERROR" in r.stdout + r.stderr:
                failures.append(f"{overlay} against {version}: {r.stdout}{r.stderr}")
        kinds = re.findall(r"^kind: (\w+)", rendered, re.M)
        print(f"{overlay}: {len(kinds)} objects ({', '.join(sorted(kinds))}) valid against {', '.join(VERSIONS)}")
        for env in sorted(set(re.findall(r"name: (TANDEM_[A-Z0-9_]+)", rendered)) - known_env):
            failures.append(f"{overlay}: {env} is not a variable tandem reads (README's table)")
        for args in re.findall(r"args:\n((?:\s+- .*\n)+)", rendered):
            for flag in re.findall(r"- (--[a-z0-9-]+)", args):
                if flag not in known_flags:
                    failures.append(f"{overlay}: {flag} is not a flag of tandem serve (README's table)")
        for probe in re.findall(r"(readinessProbe|startupProbe):\n\s+httpGet:\n((?:\s+\w+: .*\n)+)", rendered):
            if "path: /health" not in probe[1] or "port: http" not in probe[1]:
                failures.append(f"{overlay}: {probe[0]} does not ask /health on the http port")
        if "containerPort: 8000" not in rendered or 'value: "8000"' not in rendered:
            failures.append(f"{overlay}: the container port is not the port TANDEM_PORT sets")
        if overlay == "cluster" and rendered.count("tandem nodes drain") != 2:
            failures.append("cluster: both Deployments should drain their node before stopping")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
