/* minimal.c - the smallest complete capex loop: fp16 model + fp32 master
   weights (Apex O2), dynamic loss scaling, gradient clipping, fused AdamW.
   It fits y = 3x - 1 on the CPU.   cc minimal.c -lm && ./a.out */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <math.h>
#include <stdio.h>

int main(void) {
    float master[2] = {0, 0};        /* w, b in fp32: what AdamW updates   */
    uint16_t model[2], grad[2];      /* fp16 copy the "engine" computes in */
    capex_amp_config amp; capex_scaler sc; capex_scaler_desc sd;
    capex_optim *opt; capex_optim_desc od; capex_optim_param p;
    capex_tensor gt = {grad, 2}; capex_tensor_list gl = capex_tensor_list_make(CAPEX_F16, &gt, 1);
    int step;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM); od.defaults.lr = 0.05f; /* AdamW */
    capex_optim_param_init(&p);
    if (capex_amp_resolve(CAPEX_O2, CAPEX_F16, NULL, &amp) ||            /* Apex O2 */
        capex_scaler_desc_from_amp(&amp, &sd) || capex_scaler_init(&sc, &sd) || /* dynamic, 65536 */
        capex_optim_param_from_amp(&amp, master, model, grad, 2, &p) ||  /* masters write the copy */
        capex_optim_create(&od, &opt) || capex_optim_add_group(opt, NULL, &p, 1, NULL))
        return printf("%s\n", capex_last_error()), 1;
    capex_f32_to_f16_array(master, model, 2);
    for (step = 0; step < 300; step++) {
        float w = capex_f16_to_f32(model[0]), b = capex_f16_to_f32(model[1]), gw = 0, gb = 0, loss = 0;
        float scale = 1.0f, inv_scale = 1.0f, norm = 0.0f, x;
        int do_step;
        capex_scaler_scale(&sc, &scale);
        for (x = -1; x <= 1; x += 0.25f) {                              /* forward + backward */
            float err = w * x + b - (3 * x - 1);
            loss += err * err / 9; gw += 2 * err * x / 9; gb += 2 * err / 9;
        }
        grad[0] = capex_f32_to_f16(gw * scale); grad[1] = capex_f32_to_f16(gb * scale); /* scaled fp16 grads */
        capex_multi_tensor_l2norm(NULL, &gl, &norm, NULL);              /* inf/NaN shows in the norm */
        capex_scaler_unscale(&sc, 0, !isfinite(norm), &inv_scale);
        capex_scaler_step(&sc, 0, &do_step);
        capex_optim_step(opt, inv_scale, capex_clip_coef(norm * inv_scale, 1.0f), !do_step);
        capex_scaler_update(&sc);
        if (step % 50 == 0 || step == 299) printf("step %3d  loss %.6f  w %.4f  b %.4f  scale %g\n", step, loss, master[0], master[1], scale);
    }
    capex_optim_destroy(opt);
    return fabsf(master[0] - 3) < 0.01f && fabsf(master[1] + 1) < 0.01f ? 0 : 1;
}
