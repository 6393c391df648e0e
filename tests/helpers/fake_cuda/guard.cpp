// A do-nothing device guard for CUDA, for a CPU build of torch.
//
// Fake tensors (torch._subclasses.fake_tensor) may say device='cuda' without any CUDA in the build, but
// autograd's engine and ``DeviceGuard``s ask c10's guard registry for the CUDA implementation and abort
// ("PyTorch is not linked with support for cuda devices"). This one stands in for it: one device (cuda:0),
// streams that are only ids, events that never wait. Nothing runs on it: only fake tensors carry the device.
// It also counts guard calls that would wait for the device (stream/event/device synchronisation), so tests
// can tell if anything synchronised.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>

std::atomic<int64_t> g_syncs{0};  // synchronisations asked of the device (none should be)

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;
using c10::StreamId;

thread_local StreamId g_stream = 0;  // the current stream of cuda:0 (0: the default stream)

struct FakeCudaGuard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::CUDA; }
  Device exchangeDevice(Device) const override { return Device(DeviceType::CUDA, 0); }
  Device getDevice() const override { return Device(DeviceType::CUDA, 0); }
  void setDevice(Device d) const override {
    TORCH_CHECK(d.index() <= 0, "fake CUDA has one device, asked for ", d);
  }
  void uncheckedSetDevice(Device) const noexcept override {}
  Stream getStream(Device) const noexcept override {
    return Stream(Stream::UNSAFE, Device(DeviceType::CUDA, 0), g_stream);
  }
  Stream getNewStream(Device, int) const override {
    static std::atomic<StreamId> next{1};
    return Stream(Stream::UNSAFE, Device(DeviceType::CUDA, 0), next++);
  }
  Stream getStreamFromGlobalPool(Device d, bool) const override { return getNewStream(d, 0); }
  Stream exchangeStream(Stream s) const noexcept override {
    Stream old = getStream(s.device());
    g_stream = s.id();
    return old;
  }
  DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override { ++g_syncs; }
  void synchronizeEvent(void*) const override { ++g_syncs; }
  void synchronizeDevice(const DeviceIndex) const override { ++g_syncs; }
  void recordDataPtrOnStream(const c10::DataPtr&, const Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(CUDA, FakeCudaGuard);

}  // namespace

namespace at {
// ATen's CUDA hooks (at::hasCUDA, at::getAccelerator): autograd's engine asks for the accelerator to keep the
// backward on the forward's streams. Registered under the name ATen looks up ("CUDAHooks"); this works only if
// nothing asked for the hooks before this library was loaded (ATen creates them once and keeps them).
struct FakeCUDAHooks final : public CUDAHooksInterface {
  explicit FakeCUDAHooks(CUDAHooksArgs) {}
  bool hasCUDA() const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  void init() const override {}
  DeviceIndex deviceCount() const override { return 1; }
  int getNumGPUs() const override { return 1; }
  DeviceIndex current_device() const override { return 0; }
  void setCurrentDevice(DeviceIndex) const override {}
  DeviceIndex getCurrentDevice() const override { return 0; }
  DeviceIndex exchangeDevice(DeviceIndex) const override { return 0; }
  DeviceIndex maybeExchangeDevice(DeviceIndex) const override { return 0; }
  void deviceSynchronize(DeviceIndex) const override { ++g_syncs; }
};
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, FakeCUDAHooks);  // key "CUDAHooks": the name ATen creates
}  // namespace at

// Read through ctypes: the library is plain C++ linked against c10 and torch_cpu only (no Python module), so
// that it can be loaded before ``import torch`` (see __init__.py: why).
extern "C" int64_t fake_cuda_syncs() { return g_syncs.load(); }
