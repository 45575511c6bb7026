// SPDX-License-Identifier: Apache-2.0
// Multicast-object hook bodies (cuMulticastCreate, AddDevice, BindMem, BindAddr, Unbind; cuda.h
// 13.0 group CUDA_MULTICAST): the object is a handle value the VMM model knows (it is released
// with cuMemRelease), and each binding is something that holds the program's memory
// (policy/nccl_holds.h): a free, unmap or release of bound memory is free-bound.
#include "handlers.h"
#include "shield.h"

namespace cmg::shim {

CUresult mc_create(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop,
                   decltype(&::cuMulticastCreate) drv) {
  auto real = [&] { return drv(mc, prop); };
  return shielded<CUresult>(Api::cuMulticastCreate, real, [&](auto &fwd) {
    Call c(Api::cuMulticastCreate, StackWhen::Always, Nested::Always);
    if (!c.tracked() || !mc || !prop) return fwd();
    const CUresult r = fwd();
    Args args;
    args.u("devices", prop->numDevices).u("size", prop->size).u("handle_types", prop->handleTypes);
    if (r == CUDA_SUCCESS) {
      args.hex("handle", *mc);
      // No memory of its own (bound memory backs it): a handle, 0 bytes.
      state().vmm.on_create(*mc, 0, Location::Other, -1, static_cast<unsigned>(prop->handleTypes),
                            false, c.ev(), t_vmm);
    }
    c.log(r, args);
    return r;
  });
}

CUresult mc_add_device(CUmemGenericAllocationHandle mc, CUdevice dev,
                       decltype(&::cuMulticastAddDevice) drv) {
  auto real = [&] { return drv(mc, dev); };
  return shielded<CUresult>(Api::cuMulticastAddDevice, real, [&](auto &fwd) {
    Call c(Api::cuMulticastAddDevice, StackWhen::Never, Nested::Always);
    if (!c.tracked()) return fwd();
    const CUresult r = fwd();
    Args args;
    args.hex("handle", mc).i("dev", dev);
    c.log(r, args);
    return r;
  });
}

CUresult mc_bind_mem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                     CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                     unsigned long long flags, decltype(&::cuMulticastBindMem) drv) {
  auto real = [&] { return drv(mc, mc_offset, mem, mem_offset, size, flags); };
  return shielded<CUresult>(Api::cuMulticastBindMem, real, [&](auto &fwd) {
    Call c(Api::cuMulticastBindMem, StackWhen::Always, Nested::Always);
    if (!c.tracked()) return fwd();
    const CUresult r = fwd();
    Args args;
    args.hex("handle", mc)
        .u("mc_offset", mc_offset)
        .hex("mem", mem)
        .u("mem_offset", mem_offset)
        .u("size", size)
        .u("flags", flags);
    if (r == CUDA_SUCCESS) {
      State &s = state();
      Hold h;
      h.kind = HoldKind::BindMem;
      h.owner = h.handle = mc;
      h.size = size;
      h.mc_offset = mc_offset;
      h.made = c.ev();
      if (const auto hr = s.vmm.handle(mem); hr && hr->refs) {
        h.alloc_id = hr->alloc_id;
        if (const auto a = s.vmm.alloc(hr->alloc_id)) h.dev = a->dev();
      }
      s.nccl.on_bind(h);
    }
    c.log(r, args);
    return r;
  });
}

CUresult mc_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr va,
                      size_t size, unsigned long long flags, decltype(&::cuMulticastBindAddr) drv) {
  auto real = [&] { return drv(mc, mc_offset, va, size, flags); };
  return shielded<CUresult>(Api::cuMulticastBindAddr, real, [&](auto &fwd) {
    Call c(Api::cuMulticastBindAddr, StackWhen::Always, Nested::Always);
    if (!c.tracked()) return fwd();
    const CUresult r = fwd();
    Args args;
    args.hex("handle", mc)
        .u("mc_offset", mc_offset)
        .hex("ptr", va)
        .u("size", size)
        .u("flags", flags);
    if (r == CUDA_SUCCESS) {
      State &s = state();
      Hold h;
      h.kind = HoldKind::BindAddr;
      h.owner = h.handle = mc;
      h.va = va;
      h.size = size;
      h.mc_offset = mc_offset;
      h.made = c.ev();
      if (const auto m = s.vmm.mapped_at(va)) {
        h.alloc_id = m->first.id;
        h.dev = m->first.dev();
      }
      s.nccl.on_bind(h);
    }
    c.log(r, args);
    return r;
  });
}

CUresult mc_unbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset, size_t size,
                   decltype(&::cuMulticastUnbind) drv) {
  auto real = [&] { return drv(mc, dev, mc_offset, size); };
  return shielded<CUresult>(Api::cuMulticastUnbind, real, [&](auto &fwd) {
    Call c(Api::cuMulticastUnbind, StackWhen::Never, Nested::Always);
    if (!c.tracked()) return fwd();
    const CUresult r = fwd();
    Args args;
    args.hex("handle", mc).i("dev", dev).u("mc_offset", mc_offset).u("size", size);
    if (r == CUDA_SUCCESS) state().nccl.on_unbind(mc, dev, mc_offset, size);
    c.log(r, args);
    return r;
  });
}

}  // namespace cmg::shim
