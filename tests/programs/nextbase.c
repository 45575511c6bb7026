/* SPDX-License-Identifier: Apache-2.0 */
/* The next definition of cmg_probe_fn after libnextdef.so (see nextdef.c). */
const char *cmg_probe_fn(void) { return "nextbase"; }
