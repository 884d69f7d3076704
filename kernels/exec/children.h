// Every process attest starts (exec workers, plugin children, helper commands) and
// everything those start in turn, so that none outlives the call, the kernel or attest.
//
// 1. attest is a child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER): a descendant whose
//    parent dies (a worker's `setsid` helper, a plugin's fork) is reparented to attest rather
//    than to init, so it stays findable.
// 2. Each child is registered, under a lock held across its creation, with a token that
//    spawned workers also carry in their environment (ATTEST_CHILD_TOKEN), which
//    descendants inherit through exec: an orphan that reaches attest can be told apart as
//    belonging to a live child or to one that is gone.
// 3. KillProcessTree stops (SIGSTOP) the child, its process group and every descendant found
//    through /proc/<pid>/stat parent links until no new one appears, then kills them all
//    (SIGKILL), so that a process forking in a loop cannot outrun the kill.
// 4. ReapStrays kills and reaps the orphans that reached attest and belong to no live child.
// 5. InstallSignalCleanup: SIGINT, SIGTERM and SIGHUP ask attest to stop (StopSignal()),
//    kill every child tree at once, so that a call blocked on a hung child returns; after a
//    grace period for the run to write its reports (or when main calls FinishIfStopped),
//    registered temporary paths (reference/io/files.h) are removed and attest ends by the
//    signal that stopped it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "reference/status.h"

namespace attest {

// Makes this process a child subreaper (Linux >= 3.4); false if the kernel refused.
bool BecomeSubreaper();

// The environment variable a spawned child carries its token in.
inline constexpr const char* kChildTokenVariable = "ATTEST_CHILD_TOKEN";

// Creates one child under the registry's lock: `start(token)` must create the process and
// return its pid (or an Error); it is registered before the lock is released, so that no
// concurrent ReapStrays can take it for an orphan. Refused once a stop was requested.
Expected<pid_t> StartRegisteredChild(
    const std::function<Expected<pid_t>(const std::string&)>& start);
// Called first thing in a child that `start` forked (and that does not exec): gives it an
// empty registry of its own, since the inherited one is locked and lists the parent's
// children.
void ForgetChildrenAfterFork();
// Forgets a child its owner has reaped.
void UnregisterChild(pid_t pid);

// Stops, then SIGKILLs, `pid`, its process group and all its descendants. Does not reap
// `pid` (its owner does), but reaps the descendants that became attest's children.
void KillProcessTree(pid_t pid);
// Kills and reaps children of attest that are not registered and whose token names no
// registered child (orphans of a child that ended).
void ReapStrays();
// Kills every registered child's tree and every stray (used when attest stops).
void KillAllChildren();

// Pids of the live descendants of `pid` (not `pid` itself), from /proc.
std::vector<pid_t> Descendants(pid_t pid);

// Installs the handlers of item 5 above (once; later calls do nothing).
void InstallSignalCleanup(std::chrono::milliseconds grace = std::chrono::seconds(10));
// 0, or the signal that asked attest to stop.
int StopSignal();
// "SIGTERM" for messages ("" when no stop was requested).
std::string StopSignalName();
// If a stop was requested: removes the registered temporaries and ends the process by that
// signal (does not return). Otherwise returns at once. Call on the way out of main.
void FinishIfStopped();

}  // namespace attest
