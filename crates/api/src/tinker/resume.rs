//! A cluster's Tinker sessions in the store: what their host writes of them (the session, then
//! each model's creation), and how another node takes a session over when its host stopped.
//!
//! Taking over rebuilds each model as it was created (base model, rank, modules, seed) and loads
//! its newest saved state (`save_state`, with the optimizer), or the state it was created from:
//! the model resumes from its last saved state, and the calls the stopped node had taken since are
//! lost (their futures answer an error, [`lost_call`]). The order of its calls starts again at the
//! first one that arrives (`SeqOrder::resumed`). Sampling sessions are not rebuilt: a client makes
//! a new one (the SDK's RL loops do at every step).

use super::TinkerState;
use crate::AppState;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use tandem_core::tinker::{CheckpointKey, CheckpointKind, LoraSpec, Modules, RunId, TinkerError};
use tandem_store::TinkerSession;
use tandem_tinker::catalog::store_error;
use tandem_tinker::registry::{ModelEntry, Outcome};

/// A model as its session's row keeps it: what rebuilds it on another node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct ModelSpec {
    pub seq: u64,
    pub base_model: String,
    pub rank: usize,
    #[serde(default)]
    pub seed: Option<u64>,
    pub modules: Modules,
    /// Its tandem model record.
    pub record: uuid::Uuid,
    /// The saved state it was created from (`load_weights`), loaded when none was saved since.
    #[serde(default)]
    pub loaded: Option<String>,
}

/// The lock that orders the row's writers and a takeover (one per session).
fn row_lock(session: &str) -> String {
    format!("session-row:{session}")
}

/// Records a new session of `entity` as hosted by this node (a node alone on its store keeps no
/// rows).
pub(super) async fn record_session(state: &AppState, entity: &str, session: &str) -> Result<(), TinkerError> {
    let Some(me) = state.node_id() else { return Ok(()) };
    let row = TinkerSession { id: session.into(), entity: entity.into(), node: me.into(), models: json!([]) };
    state.store().tinker_session_put(&row).await.map_err(|e| store_error(e, "recording the session"))
}

/// Adds a model to its session's row, so a node taking the session over rebuilds it.
pub(super) async fn record_model(
    state: &AppState,
    entity: &str,
    run: &RunId,
    spec: ModelSpec,
) -> Result<(), TinkerError> {
    if state.node_id().is_none() {
        return Ok(());
    }
    let _row = state.tinker().runs.lock(entity, &row_lock(run.session())).await;
    let store = state.store();
    let failed = |e| store_error(e, "recording the model");
    let Some(mut row) = store.tinker_session(run.session()).await.map_err(failed)? else {
        return Err(TinkerError::NotFound("session not found".into()));
    };
    let mut models: Vec<ModelSpec> = serde_json::from_value(row.models.clone()).unwrap_or_default();
    models.retain(|m| m.seq != spec.seq);
    models.push(spec);
    row.models = serde_json::to_value(models).unwrap_or_else(|_| json!([]));
    store.tinker_session_put(&row).await.map_err(failed)
}

/// Forgets ended sessions' rows (a row another node took over stays its).
pub(super) fn forget_sessions(state: &AppState, sessions: Vec<String>) {
    let Some(me) = state.node_id().map(str::to_string) else { return };
    if sessions.is_empty() {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let store = state.store();
        for s in sessions {
            if let Err(e) = store.tinker_session_drop(&s, &me).await {
                tracing::warn!(session = %s, error = %e, "could not forget an ended Tinker session's row");
            }
        }
    });
}

/// Forgets the rows of sessions whose node left the registry a day ago or more and that no
/// client came back for (the registry drops a node a day after its last beat).
pub(crate) async fn sweep_orphans(state: &AppState) {
    let before = tandem_store::now_ms() - 86_400_000;
    match state.store().tinker_session_sweep(before).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(sessions = n, "forgot Tinker sessions of nodes long gone"),
        Err(e) => tracing::debug!(error = %e, "could not sweep Tinker sessions of gone nodes"),
    }
}

/// Makes sure this node holds session `row` (its host): taken over, with its models rebuilt,
/// when it does not yet (its previous host stopped).
pub(super) async fn hold(state: &AppState, row: &TinkerSession) -> Result<(), TinkerError> {
    let t = state.tinker().clone();
    // A session created here: held. One taken over: held once its models are rebuilt, which
    // happens under the row's lock (calls arriving meanwhile wait for it).
    if t.session(&row.entity, &row.id) == Some(false) {
        return Ok(());
    }
    let _row = t.runs.lock(&row.entity, &row_lock(&row.id)).await;
    if t.session(&row.entity, &row.id).is_some() {
        return Ok(());
    }
    let trainer = state
        .tinker_trainer()
        .ok_or_else(|| TinkerError::Unavailable("this node does not train; retry through another node".into()))?;
    t.adopt_session(&row.entity, &row.id);
    let specs: Vec<ModelSpec> = serde_json::from_value(row.models.clone()).unwrap_or_default();
    tracing::warn!(session = %row.id, models = specs.len(), "taking over a Tinker session whose node stopped");
    for spec in specs {
        let Some(run) = RunId::new(&row.id, spec.seq) else { continue };
        if let Err(e) = rebuild(state, &t, trainer.clone(), &row.entity, &run, &spec).await {
            tracing::warn!(model = %run, error = %e, "could not rebuild a Tinker model taken over; it is gone");
            t.remove_model(&run);
        }
    }
    Ok(())
}

/// Rebuilds one model of a session taken over: created as it was, then its newest saved state.
async fn rebuild(
    state: &AppState,
    t: &Arc<TinkerState>,
    trainer: Arc<dyn tandem_core::tinker::TinkerTrainer>,
    entity: &str,
    run: &RunId,
    spec: &ModelSpec,
) -> Result<(), TinkerError> {
    let id = run.to_string();
    // A retried `create_model` gets a future that says it exists.
    let (request, promise) = t.future(entity, run.session())?;
    promise.set(Outcome::Json(json!({ "model_id": id, "type": "create_model" })));
    let entry = ModelEntry::new(run.clone(), entity, &spec.base_model, spec.rank, &request, spec.record).resumed();
    let _place = t.reserve_model(entity)?;
    if !t.enter_model(Arc::new(entry)) {
        return Err(TinkerError::NotFound("session not found".into()));
    }
    let mut saved =
        state.store().tinker_list(entity, Some(&id)).await.map_err(|e| store_error(e, "reading the catalog"))?;
    saved.retain(|e| e.key.kind == CheckpointKind::Weights);
    let newest = saved.into_iter().max_by_key(|e| e.created_at).map(|e| e.key);
    let key = newest.or_else(|| spec.loaded.as_deref().and_then(CheckpointKey::parse_path));
    let dir = match &key {
        Some(key) => match state.catalog().state(entity, key, true).await? {
            Some(s) => Some(s.dir),
            None => return Err(TinkerError::NotFound(format!("the saved state {} is gone", key.path()))),
        },
        None => None,
    };
    let lora = LoraSpec { rank: spec.rank, seed: spec.seed, modules: spec.modules };
    let (base, owner) = (spec.base_model.clone(), entity.to_string());
    tokio::task::spawn_blocking(move || {
        trainer.create(&owner, &id, &base, lora)?;
        match dir {
            Some(dir) => trainer.load_state_into(&id, &dir, true),
            None => Ok(()),
        }
    })
    .await
    .map_err(|e| TinkerError::Server(format!("rebuilding the model failed: {e}")))??;
    tracing::info!(model = %run, from = ?key.map(|k| k.path()), "a Tinker model taken over resumed");
    Ok(())
}

/// The answer to a future this node does not know of a session it took over: the call ran (or
/// waited) on the node that stopped, and is lost.
pub(super) fn lost_call(t: &TinkerState, entity: &str, request_id: &str) -> Option<Outcome> {
    let session = tandem_core::tinker::session_of(request_id)?;
    (t.session(entity, session) == Some(true)).then(|| {
        Outcome::server(
            "this call was lost: the node holding its Tinker session stopped before answering it; the session's \
             models resumed on another node from their last saved states (save_state), and calls made after \
             those saves must be made again",
        )
    })
}
