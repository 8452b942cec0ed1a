/* port_before.c - a plain C training loop before capex: fp32 weights,
   hand-written SGD, one process. examples/port_after.c is the same program
   after the port (README: "Porting a C training loop"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_FEAT 512
#define N_DATA 8192
#define BATCH 64
#define STEPS 400

static float X[N_DATA][N_FEAT], Y[N_DATA];

static void make_data(void) { /* y = x . w_true + noise, fixed seed */
    unsigned s = 12345;
    float w_true[N_FEAT];
    int i, j;
    for (j = 0; j < N_FEAT; j++) { s = s * 1664525u + 1013904223u; w_true[j] = (float)(s >> 8) / 16777216.0f - 0.5f; }
    for (i = 0; i < N_DATA; i++) {
        double y = 0;
        for (j = 0; j < N_FEAT; j++) { s = s * 1664525u + 1013904223u; X[i][j] = (float)(s >> 8) / 8388608.0f - 1.0f; y += X[i][j] * w_true[j]; }
        s = s * 1664525u + 1013904223u;
        Y[i] = (float)y + 0.01f * ((float)(s >> 8) / 8388608.0f - 1.0f);
    }
}

/* The engine: mean squared error and its gradient (added into g). */
static float forward_backward(const float *w, const int *idx, int n, float *g) {
    float loss = 0;
    int b, j;
    for (b = 0; b < n; b++) {
        const float *x = X[idx[b]];
        float err = -Y[idx[b]];
        for (j = 0; j < N_FEAT; j++) err += x[j] * w[j];
        loss += err * err / (float)n;
        for (j = 0; j < N_FEAT; j++) g[j] += 2.0f * err * x[j] / (float)n;
    }
    return loss;
}

int main(void) {
    static float w[N_FEAT], g[N_FEAT];
    int idx[BATCH], step, b, j;
    float loss = 0;
    make_data();
    for (step = 0; step < STEPS; step++) {
        for (b = 0; b < BATCH; b++) idx[b] = (step * BATCH + b) % N_DATA;
        memset(g, 0, sizeof g);
        loss = forward_backward(w, idx, BATCH, g);
        for (j = 0; j < N_FEAT; j++) w[j] -= 0.05f * g[j];
        if (step % 100 == 0) printf("step %4d  loss %.5f\n", step, loss);
    }
    printf("final loss %.5f\n", loss);
    return loss < 0.01f ? 0 : 1;
}
