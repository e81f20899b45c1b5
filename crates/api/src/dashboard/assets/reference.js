// The API reference, rendered from this server's own /openapi.json (so it cannot drift from
// the routes): operations by tag with their parameters, bodies and answers, then the schemas.
import { el, nav, show } from "./dom.js";

const refName = (ref) => (ref || "").split("/").pop();
const anchor = (name) => `schema-${name.replace(/[^A-Za-z0-9_-]/g, "-")}`;

/** A schema in one line: a link for a reference, else its type (of items, or alternatives). */
function typeOf(s) {
  if (!s) return "";
  if (s.$ref) return el("a", { href: `#/api?schema=${encodeURIComponent(refName(s.$ref))}` }, refName(s.$ref));
  const alts = s.oneOf || s.anyOf || s.allOf;
  if (alts) return el("span", {}, ...alts.flatMap((a, i) => [i ? " | " : "", typeOf(a)]));
  if (s.type === "array") return el("span", {}, "array of ", typeOf(s.items));
  const t = Array.isArray(s.type) ? s.type.join(" | ") : s.type || "any";
  return el("span", {}, t, s.enum ? ` (${s.enum.map((e) => JSON.stringify(e)).join(", ")})` : "");
}

function operation(path, method, op) {
  const params = op.parameters || [];
  const body = op.requestBody && op.requestBody.content;
  const bodySchema = body && (body["application/json"] || Object.values(body)[0]);
  return el("details", { class: "op" },
    el("summary", {}, el("span", { class: `method ${method}` }, method.toUpperCase()), " ", el("code", {}, path), " ", op.summary || ""),
    op.description ? el("p", {}, op.description) : "",
    op.security && op.security.length ? el("p", { class: "hint" }, "Needs an API key (Bearer).") : "",
    params.length ? el("table", {},
      el("thead", {}, el("tr", {}, ["Parameter", "In", "Type", "Description"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...params.map((p) => el("tr", {},
        el("td", {}, el("code", {}, p.name), p.required ? " (required)" : ""), el("td", {}, p.in),
        el("td", {}, typeOf(p.schema)), el("td", {}, p.description || ""))))) : "",
    bodySchema ? el("p", {}, "Body: ", typeOf(bodySchema.schema)) : "",
    el("ul", {}, ...Object.entries(op.responses || {}).map(([status, r]) => {
      const c = r.content && (r.content["application/json"] || Object.values(r.content)[0]);
      return el("li", {}, el("strong", {}, status), ` ${r.description || ""} `, c && c.schema ? typeOf(c.schema) : "");
    })));
}

function schema(name, s) {
  const props = Object.entries(s.properties || {});
  const required = new Set(s.required || []);
  return el("section", { id: anchor(name), class: "schema" },
    el("h3", {}, name),
    s.description ? el("p", {}, s.description) : "",
    props.length ? el("table", {},
      el("thead", {}, el("tr", {}, ["Field", "Type", "Description"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...props.map(([k, v]) => el("tr", {},
        el("td", {}, el("code", {}, k), required.has(k) ? " (required)" : ""), el("td", {}, typeOf(v)), el("td", {}, v.description || ""))))) : el("p", {}, typeOf(s)));
}

export async function reference(params, gen) {
  const spec = await fetch("/openapi.json").then((r) => r.json());
  if (gen !== nav.generation) return;
  const byTag = new Map();
  for (const [path, item] of Object.entries(spec.paths || {})) {
    for (const [method, op] of Object.entries(item)) {
      if (!["get", "post", "put", "patch", "delete"].includes(method)) continue;
      const tag = (op.tags && op.tags[0]) || "other";
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push(operation(path, method, op));
    }
  }
  const schemas = Object.entries((spec.components && spec.components.schemas) || {});
  show(
    el("h1", {}, `API reference · ${spec.info ? `${spec.info.title} ${spec.info.version}` : ""}`),
    el("p", {}, "From this server's ", el("a", { href: "/openapi.json" }, "/openapi.json"), ". Open an operation to read its parameters and answers."),
    ...[...byTag.entries()].map(([tag, ops]) => el("section", {}, el("h2", {}, tag), ...ops)),
    el("h2", {}, "Schemas"),
    ...schemas.map(([name, s]) => schema(name, s)),
  );
  const wanted = params.get("schema");
  if (wanted) {
    const target = document.getElementById(anchor(wanted));
    if (target) {
      target.setAttribute("tabindex", "-1");
      target.scrollIntoView();
      target.focus();
    }
  }
}
