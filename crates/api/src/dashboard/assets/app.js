// tandem's dashboard: the router, sign-in and the models list. Each other view is a module of
// its own (model.js, job.js, trajectories.js, server.js, reference.js); dom.js holds what they
// share. Every view reads the same JSON routes any client does, with the signed-in key.
import { KEY, UUID, key, nav, el, api, show, when, num, table } from "./dom.js";
import { model } from "./model.js";
import { job } from "./job.js";
import { trajectories } from "./trajectories.js";
import { server } from "./server.js";
import { reference } from "./reference.js";

const main = document.getElementById("main");

function signOut() {
  sessionStorage.removeItem(KEY);
  route();
}

function signIn(why = "") {
  const input = el("input", { id: "key", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const status = el("p", { class: "error", role: "alert" }, why);
  const form = el(
    "form",
    {
      class: "signin",
      onsubmit: async (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(KEY, input.value.trim());
        try {
          await api("/v1/preview/models?limit=1");
          route();
        } catch (e) {
          sessionStorage.removeItem(KEY);
          status.textContent = e.message;
        }
      },
    },
    el("h1", {}, "Sign in"),
    el("label", { for: "key" }, "API key (printed by `make run`, kept in this tab only)"),
    input,
    el("button", { class: "primary", type: "submit" }, "Sign in"),
    status,
  );
  show(form);
  input.focus();
}

/** The models list: searched and paged on the server, with each model's progress. */
async function models(params, gen) {
  const after = params.get("after");
  const search = (params.get("search") || "").slice(0, 256);
  const q = new URLSearchParams({ limit: "50", summary: "true" });
  if (after && UUID.test(after)) q.set("after", after);
  if (search) q.set("search", search);
  const page = await api(`/v1/preview/models?${q}`);
  if (gen !== nav.generation) return;
  const box = el("input", { type: "search", id: "search", name: "search", placeholder: "project/name contains", value: search });
  const form = el("form", {
    class: "toolbar",
    role: "search",
    onsubmit: (ev) => {
      ev.preventDefault();
      location.hash = box.value ? `#/?${new URLSearchParams({ search: box.value })}` : "#/";
    },
  }, el("label", { for: "search" }, "Search"), box, el("button", { type: "submit" }, "Search"));
  const rows = page.data.map((m) => {
    const s = m.summary || {};
    return el("tr", {},
      el("td", {}, el("a", { href: `#/models/${m.id}` }, m.name)),
      el("td", {}, m.project),
      el("td", {}, m.base_model),
      el("td", {}, s.latest_step ?? ""),
      el("td", {}, Number.isFinite(s.last_reward) ? `${num(s.last_reward, 4)} (${s.last_reward_key})` : ""),
      el("td", {}, when(s.last_activity || m.created_at)));
  });
  const last = page.data[page.data.length - 1];
  const next = new URLSearchParams({ ...(search ? { search } : {}), ...(last ? { after: last.id } : {}) });
  show(
    el("h1", {}, "Models"),
    form,
    table(["Name", "Project", "Base model", "Latest step", "Last reward", "Last activity"], el("tbody", {}, rows)),
    page.data.length === 0
      ? el("p", {}, search ? "No model matches." : "No models yet: ART's ServerlessBackend creates one when it registers a model.") : "",
    el("p", {},
      after ? el("a", { href: search ? `#/?${new URLSearchParams({ search })}` : "#/" }, "First page") : "",
      after && page.has_more ? " · " : "",
      page.has_more && last ? el("a", { href: `#/?${next}` }, "Next page") : ""),
  );
}

async function route() {
  const signedIn = Boolean(key());
  document.getElementById("signout").hidden = !signedIn;
  document.getElementById("who").textContent = signedIn ? "signed in" : "";
  const gen = ++nav.generation;
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/");
  const params = new URLSearchParams(query || "");
  try {
    // The reference is public (as /openapi.json is); everything else needs the key.
    if (parts[0] === "api") await reference(params, gen);
    else if (!signedIn) return signIn();
    else if (parts[0] === "models" && UUID.test(parts[1] || "") && parts[2] === "trajectories") await trajectories(parts[1], params, gen);
    else if (parts[0] === "models" && UUID.test(parts[1] || "") && !parts[2]) await model(parts[1], gen);
    else if (parts[0] === "jobs" && UUID.test(parts[1] || "")) await job(parts[1], gen);
    else if (parts[0] === "server") await server(gen);
    else if (parts[0] === "" ) await models(params, gen);
    else show(el("h1", {}, "Not found"), el("p", {}, el("a", { href: "#/" }, "The models list")));
  } catch (e) {
    if (gen !== nav.generation) return;
    if (e.status === 401) {
      // A key revoked meanwhile: back to the sign-in form, saying why.
      sessionStorage.removeItem(KEY);
      document.getElementById("signout").hidden = true;
      document.getElementById("who").textContent = "";
      return signIn(e.message);
    }
    show(el("h1", {}, "Something went wrong"), el("p", { class: "error", role: "alert" }, e.message));
  }
  if (gen === nav.generation) main.focus();
}

document.getElementById("signout").addEventListener("click", signOut);
window.addEventListener("hashchange", route);
route();
