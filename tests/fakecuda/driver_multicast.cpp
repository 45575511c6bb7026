// SPDX-License-Identifier: Apache-2.0
// Fake driver: multicast objects (cuMulticastCreate, AddDevice, BindMem, BindAddr, Unbind,
// GetGranularity) with the argument rules of cuda.h 13.0 (group CUDA_MULTICAST). Off unless
// FAKECUDA_MULTICAST=1: a device without NVLink multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
// 0) answers CUDA_ERROR_NOT_SUPPORTED, one of the statuses cuda.h lists for each call.
//
// Not measured (README.md, "Not measured"): what the driver does with memory that is released or
// unmapped while still bound. Here a binding keeps the physical allocation alive, as a mapping
// does (D13), until it is unbound or the multicast object is released; cuMemMap of a multicast
// handle is not modelled (NOT_SUPPORTED).
#include "driver_memory.h"

#include <algorithm>

namespace fc {

bool Memory::release_multicast(unsigned long long value) {
  auto it = multicasts.find(value);
  if (it == multicasts.end()) return false;
  std::vector<unsigned long long> bound;
  for (const Multicast::Binding &b : it->second.bindings) bound.push_back(b.alloc);
  multicasts.erase(it);
  retire_value(value);
  for (unsigned long long id : bound) {
    if (auto a = allocs.find(id); a != allocs.end() && a->second.bindings) --a->second.bindings;
    drop_if_unused(id);
  }
  return true;
}

namespace {

// cuda.h: size, offsets and bind sizes are multiples of the minimum granularity.
constexpr std::size_t kMcGranularity = kGranularity;

CUresult supported() {
  if (CUresult r = require_init()) return r;
  return config().multicast ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult granularity(std::size_t *gran, const CUmulticastObjectProp *prop,
                     CUmulticastGranularity_flags option) {
  if (CUresult r = supported()) return r;
  if (!gran || !prop || prop->numDevices == 0) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MULTICAST_GRANULARITY_MINIMUM && option != CU_MULTICAST_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  *gran = kMcGranularity;
  return CUDA_SUCCESS;
}

CUresult create(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop) {
  if (CUresult r = supported()) return r;
  if (!mc || !prop || prop->numDevices == 0 || prop->size == 0 || prop->size % kMcGranularity ||
      prop->flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->handleTypes & ~static_cast<unsigned long long>(
                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->numDevices > static_cast<unsigned>(config().devices)) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  const unsigned long long v = m.issue_value();
  Multicast &o = m.multicasts[v];
  o.size = prop->size;
  o.num_devices = prop->numDevices;
  o.handle_types = prop->handleTypes;
  *mc = v;
  return CUDA_SUCCESS;
}

CUresult add_device(CUmemGenericAllocationHandle mc, CUdevice dev) {
  if (CUresult r = supported()) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.multicasts.find(mc);
  if (it == m.multicasts.end()) return CUDA_ERROR_INVALID_VALUE;
  Multicast &o = it->second;
  if (std::find(o.devices.begin(), o.devices.end(), dev) != o.devices.end() ||
      o.devices.size() >= o.num_devices)
    return CUDA_ERROR_INVALID_VALUE;
  o.devices.push_back(dev);
  return CUDA_SUCCESS;
}

// A bind of [mc_offset, +size) for the device of `alloc`: the team complete (cuda.h: binds block
// until every device is added; a one-threaded fake answers NOT_PERMITTED instead of waiting
// forever), aligned, inside both objects, and not over another binding of that device.
CUresult bind_locked(Memory &m, Multicast &o, std::size_t mc_offset, unsigned long long alloc,
                     std::size_t mem_offset, std::size_t size) {
  const PhysAlloc &a = m.allocs.at(alloc);
  if (o.devices.size() < o.num_devices) return CUDA_ERROR_NOT_PERMITTED;
  if (size == 0 || size % kMcGranularity || mc_offset % kMcGranularity ||
      mem_offset % kMcGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  if (mc_offset > o.size || size > o.size - mc_offset || mem_offset > a.size ||
      size > a.size - mem_offset)
    return CUDA_ERROR_INVALID_VALUE;
  // "The memory allocation must have been created on one of the devices ... added".
  if (a.prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || a.imported)
    return CUDA_ERROR_INVALID_DEVICE;
  const int dev = a.prop.location.id;
  if (std::find(o.devices.begin(), o.devices.end(), dev) == o.devices.end())
    return CUDA_ERROR_INVALID_DEVICE;
  // "Externally shareable ... multicast objects can be bound only to externally shareable memory".
  if (o.handle_types && !(a.prop.requestedHandleTypes & o.handle_types))
    return CUDA_ERROR_INVALID_VALUE;
  for (const Multicast::Binding &b : o.bindings)
    if (b.dev == dev && mc_offset < b.mc_offset + b.size && b.mc_offset < mc_offset + size)
      return CUDA_ERROR_INVALID_VALUE;
  o.bindings.push_back({dev, mc_offset, size, alloc, mem_offset});
  ++m.allocs.at(alloc).bindings;
  return CUDA_SUCCESS;
}

CUresult bind_mem(CUmemGenericAllocationHandle mc, std::size_t mc_offset,
                  CUmemGenericAllocationHandle handle, std::size_t mem_offset, std::size_t size,
                  unsigned long long flags) {
  if (CUresult r = supported()) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.multicasts.find(mc);
  auto h = m.handles.find(handle);
  if (it == m.multicasts.end() || h == m.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  return bind_locked(m, it->second, mc_offset, h->second.alloc, mem_offset, size);
}

CUresult bind_addr(CUmemGenericAllocationHandle mc, std::size_t mc_offset, CUdeviceptr va,
                   std::size_t size, unsigned long long flags) {
  if (CUresult r = supported()) return r;
  if (flags != 0 || va % kMcGranularity) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.multicasts.find(mc);
  if (it == m.multicasts.end()) return CUDA_ERROR_INVALID_VALUE;
  // The memory is named by a mapped address: one mapping must cover the whole bind.
  auto *mp = m.mapping_at(va);
  if (!mp || va + size > mp->first + mp->second.size) return CUDA_ERROR_INVALID_VALUE;
  return bind_locked(m, it->second, mc_offset, mp->second.alloc,
                     mp->second.offset + (va - mp->first), size);
}

// cuda.h: "mcOffset and size must match the corresponding values specified during the bind
// call. Any other values may result in undefined behavior": here they are INVALID_VALUE.
CUresult unbind(CUmemGenericAllocationHandle mc, CUdevice dev, std::size_t mc_offset,
                std::size_t size) {
  if (CUresult r = supported()) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.multicasts.find(mc);
  if (it == m.multicasts.end()) return CUDA_ERROR_INVALID_VALUE;
  auto &bs = it->second.bindings;
  auto b = std::find_if(bs.begin(), bs.end(), [&](const Multicast::Binding &x) {
    return x.dev == dev && x.mc_offset == mc_offset && x.size == size;
  });
  if (b == bs.end()) return CUDA_ERROR_INVALID_VALUE;
  const unsigned long long id = b->alloc;
  bs.erase(b);
  if (auto a = m.allocs.find(id); a != m.allocs.end() && a->second.bindings) --a->second.bindings;
  m.drop_if_unused(id);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fc

using namespace fc;

FC_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
                                     const CUmulticastObjectProp *prop) {
  return FC_CALL(cuMulticastCreate, create(mcHandle, prop));
}

FC_EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev) {
  return FC_CALL(cuMulticastAddDevice, add_device(mcHandle, dev));
}

FC_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                      CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                      size_t size, unsigned long long flags) {
  return FC_CALL(cuMulticastBindMem,
                 bind_mem(mcHandle, mcOffset, memHandle, memOffset, size, flags));
}

FC_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                       CUdeviceptr memptr, size_t size, unsigned long long flags) {
  return FC_CALL(cuMulticastBindAddr, bind_addr(mcHandle, mcOffset, memptr, size, flags));
}

FC_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                     size_t mcOffset, size_t size) {
  return FC_CALL(cuMulticastUnbind, unbind(mcHandle, dev, mcOffset, size));
}

FC_EXPORT CUresult cuMulticastGetGranularity(size_t *gran, const CUmulticastObjectProp *prop,
                                             CUmulticastGranularity_flags option) {
  return FC_CALL(cuMulticastGetGranularity, fc::granularity(gran, prop, option));
}
