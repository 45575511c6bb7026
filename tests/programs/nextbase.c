/* SPDX-License-Identifier: Apache-2.0 */
/* The next definition of cmg_probe_fn after libnextdef.so (see nextdef.c). */
const char *cmg_probe_fn(void) { return "nextbase"; }
/* Referenced by libnextdef.so so that the linker keeps it in libnextdef's DT_NEEDED. */
int cmg_nextbase_marker(void) { return 1; }
