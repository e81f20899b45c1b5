//! Any bytes as a Tinker `forward_backward` body (issue 50): read exactly as the route reads it
//! (bounded on the wire, decoded, datums checked), then through the loss the call names: its
//! settings and each datum's inputs checked, and the loss and gradient computed on made-up
//! logprobs. Must never panic: a bad body is an error value (a 422, or a failed future).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem_train::token_loss::{check_inputs, datum_loss, DatumInputs, TokenLoss};

fuzz_target!(|data: &[u8]| {
    let Ok((req, Ok((datums, config)))) = tandem_api::tinker::wire::read_request(data, 1 << 20) else { return };
    let Ok(loss) = TokenLoss::parse(&req.loss_fn, &config) else { return };
    for d in &datums {
        let inputs = DatumInputs::from_map(&d.inputs);
        if check_inputs(loss, d.targets.len(), &inputs).is_ok() {
            let lp: Vec<f64> = d.tokens.iter().map(|t| -1.0 - f64::from(*t % 7)).collect();
            let _ = datum_loss(loss, &lp, &inputs);
        }
    }
});
