/* Asynchronous execution through the C API: startCompute + Event_wait, sync fence fds
 * (ANeuralNetworksEvent_getSyncFenceFd is pollable; createFromSyncFenceFd waits on the
 * caller's fd), startComputeWithDependencies chaining executions, and bursts. */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "add_model.h"

static int readable(int fd, int timeout_ms) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1;
}

int main(void) {
    ANeuralNetworksModel* model = NULL;
    ANeuralNetworksCompilation* compilation = add_compilation(&model);
    float a[COUNT], b[COUNT], c[COUNT], d[COUNT], e[COUNT], expected[COUNT];
    for (int i = 0; i < COUNT; i++) {
        a[i] = (float)i;
        b[i] = 100.0f;
        c[i] = d[i] = e[i] = -1.0f;
    }

    /* startCompute, then chain a dependent execution that reads the first one's output. */
    ANeuralNetworksExecution* first = add_execution(compilation, a, b, c);
    ANeuralNetworksExecution* second = add_execution(compilation, c, b, d);
    ANeuralNetworksEvent* first_done = NULL;
    ANeuralNetworksEvent* second_done = NULL;
    CHECK(ANeuralNetworksExecution_startCompute(first, &first_done));
    const ANeuralNetworksEvent* dependencies[1] = {first_done};
    CHECK(ANeuralNetworksExecution_startComputeWithDependencies(second, dependencies, 1, 0, &second_done));
    CHECK(ANeuralNetworksEvent_wait(second_done));
    for (int i = 0; i < COUNT; i++) expected[i] = a[i] + 200.0f;
    expect_close("chained output", d, expected, COUNT, 0.0f);
    int fence = -1;
    CHECK(ANeuralNetworksEvent_getSyncFenceFd(second_done, &fence));
    EXPECT(fence > 0 && readable(fence, 0));
    close(fence);
    CHECK(ANeuralNetworksEvent_wait(first_done));
    ANeuralNetworksEvent_free(first_done);
    ANeuralNetworksEvent_free(second_done);
    ANeuralNetworksExecution_free(first);
    ANeuralNetworksExecution_free(second);

    /* An event made from our own fd: the dependent execution waits until we signal it. */
    int ours = eventfd(0, EFD_CLOEXEC);
    EXPECT(ours > 0);
    ANeuralNetworksEvent* gate = NULL;
    CHECK(ANeuralNetworksEvent_createFromSyncFenceFd(ours, &gate));
    ANeuralNetworksExecution* gated = add_execution(compilation, a, a, e);
    ANeuralNetworksEvent* gated_done = NULL;
    const ANeuralNetworksEvent* gate_list[1] = {gate};
    CHECK(ANeuralNetworksExecution_startComputeWithDependencies(gated, gate_list, 1, 0, &gated_done));
    int gated_fence = -1;
    CHECK(ANeuralNetworksEvent_getSyncFenceFd(gated_done, &gated_fence));
    usleep(100 * 1000);
    EXPECT(!readable(gated_fence, 0));      /* still waiting for our fence */
    EXPECT(e[0] == -1.0f && e[COUNT - 1] == -1.0f);
    uint64_t one = 1;
    EXPECT(write(ours, &one, sizeof one) == sizeof one);
    EXPECT(readable(gated_fence, 10000));   /* its own fence signals when it is done */
    CHECK(ANeuralNetworksEvent_wait(gated_done));
    CHECK(ANeuralNetworksEvent_wait(gate));
    for (int i = 0; i < COUNT; i++) expected[i] = 2.0f * a[i];
    expect_close("gated output", e, expected, COUNT, 0.0f);
    close(gated_fence);
    ANeuralNetworksEvent_free(gated_done);
    ANeuralNetworksEvent_free(gate);
    ANeuralNetworksExecution_free(gated);
    close(ours);

    /* A failing execution reports its error through the event. */
    ANeuralNetworksExecution* failing = NULL;
    CHECK(ANeuralNetworksExecution_create(compilation, &failing));
    ANeuralNetworksEvent* failing_done = NULL;
    EXPECT_CODE(ANEURALNETWORKS_BAD_DATA, ANeuralNetworksExecution_startCompute(failing, &failing_done));
    EXPECT(failing_done == NULL);
    ANeuralNetworksExecution_free(failing);

    /* Bursts: several executions in a row on one burst object. */
    ANeuralNetworksBurst* burst = NULL;
    CHECK(ANeuralNetworksBurst_create(compilation, &burst));
    for (int run = 0; run < 5; run++) {
        for (int i = 0; i < COUNT; i++) b[i] = (float)(run * 10);
        ANeuralNetworksExecution* execution = add_execution(compilation, a, b, c);
        CHECK(ANeuralNetworksExecution_burstCompute(execution, burst));
        ANeuralNetworksExecution_free(execution);
        for (int i = 0; i < COUNT; i++) expected[i] = a[i] + (float)(run * 10);
        expect_close("burst output", c, expected, COUNT, 0.0f);
    }
    /* A reusable execution computed several times through the burst, inputs changed in place. */
    ANeuralNetworksExecution* reusable = add_execution(compilation, a, b, c);
    CHECK(ANeuralNetworksExecution_setReusable(reusable, true));
    for (int run = 0; run < 3; run++) {
        b[0] = (float)run;
        CHECK(ANeuralNetworksExecution_burstCompute(reusable, burst));
        EXPECT(c[0] == a[0] + (float)run);
    }
    ANeuralNetworksExecution_free(reusable);
    ANeuralNetworksBurst_free(burst);

    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
    done("events");
    return 0;
}
