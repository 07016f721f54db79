//! Without CUDA, every entry point returns an error (never panics), and `open_or_cpu` says so
//! and returns None. On a machine with a GPU these only check that nothing panics.

use cuda::{device_count, driver_present, list_devices, open_or_cpu, CudaError, CudaOptions};

#[test]
fn missing_driver_is_an_error_not_a_panic() {
    if driver_present() {
        eprintln!("a CUDA driver is present: checking only that discovery does not panic");
        let _ = device_count();
        let _ = list_devices();
        return;
    }
    assert!(matches!(device_count(), Err(CudaError::NoDevice(_))));
    assert!(matches!(list_devices(), Err(CudaError::NoDevice(_))));
    match cuda::CudaDevice::open(&CudaOptions::default()) {
        Err(CudaError::NoDevice(msg)) => assert!(msg.contains("libcuda"), "{msg}"),
        Err(e) => panic!("expected NoDevice, got {e}"),
        Ok(_) => panic!("opened a device without a driver"),
    }
    assert!(open_or_cpu(&CudaOptions::default()).is_none());
    assert!(open_or_cpu(&CudaOptions::default()).is_none()); // the notice is printed once
}

#[test]
fn nvrtc_at_a_bad_path_is_an_error() {
    let r = cuda::nvrtc::Nvrtc::load(Some(std::path::Path::new("/nonexistent/libnvrtc.so.12")));
    assert!(matches!(r, Err(CudaError::NvrtcLoad { .. })));
}

/// The memory plan counts the page-locked logits buffer at the backend's cap.
#[test]
fn planned_logits_download_cap_is_the_backends() {
    assert_eq!(
        cuda::backend::PINNED_MAX_FLOATS,
        model::plan::LOGITS_DOWNLOAD_MAX_FLOATS
    );
}
